"""transformers' view of tokenizer directories, run as a subprocess (never import transformers or torch into a
process that imports Paddle). JSON on stdin: a list of {"directory", "conversations": [[message...]...],
"texts": [...]}; JSON on stdout, one entry per job: {"class", "renders": [[without, with the generation prompt]
per conversation], "encoded": [[with, without special tokens] per text], "chat_ids": [the tokens of each
conversation with the generation prompt (apply_chat_template(tokenize=True))]}."""
import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from transformers import AutoTokenizer  # noqa: E402


def run(job: dict) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(job["directory"])
    renders = [[tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=flag)
                for flag in (False, True)] for messages in job["conversations"]]
    encoded = [[tokenizer.encode(text, add_special_tokens=True), tokenizer.encode(text, add_special_tokens=False)]
               for text in job["texts"]]
    chat_ids = []
    for messages in job["conversations"]:
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        chat_ids.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return {"class": type(tokenizer).__name__, "renders": renders, "encoded": encoded, "chat_ids": chat_ids}


if __name__ == "__main__":
    json.dump([run(job) for job in json.load(sys.stdin)], sys.stdout)
