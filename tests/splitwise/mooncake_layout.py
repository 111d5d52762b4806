"""The small KV cache layout both sides of the Mooncake tests use (three layers: two target, one MTP)."""
from fastdeploy.splitwise import config_hash

NUM_BLOCKS, BLOCK_SIZE = 16, 4
LAYER_TAILS = ((2, 3), (2, 3), (2, 3))
NUM_TOKENS = 10                      # three blocks: two full, one with 2 positions
D_BLOCKS = [9, 10, 3]                # a run of two consecutive blocks, then one apart
P_BLOCKS = [5, 6, 2]                 # the first two consecutive on both sides: one write per layer for them
CONFIG_HASH = config_hash(model_name="fd-toy", vocab_size=64, num_speculative_tokens=1, mtp_model="fd-toy-mtp",
                          block_size=BLOCK_SIZE, kv_dtype="float32", transport="mooncake-tcp")
