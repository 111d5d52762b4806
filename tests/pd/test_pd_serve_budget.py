"""`fastdeploy serve --pd` on one host shares one KV budget among its instances (docs/serving.md "Memory"): each
role's share in proportion to its slots, one max_model_len every share holds (it is in the PD config hash), each
instance's command line carrying its share, and a share too small refused before anything starts."""
from __future__ import annotations

import pytest

from fastdeploy.config import decode_lookahead
from fastdeploy.entrypoints.cli import build_parser, main
from fastdeploy.entrypoints.pd_serve import _instance_argv, instance_flags_problem, kv_shares
from tests.checkpoint_files import write_numpy_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_numpy_checkpoint(tmp_path_factory.mktemp("ckpt") / "ernie", tokenizer=True,
                                  max_position_embeddings=65536)


def _args(*flags):
    return build_parser().parse_args(["serve", "--pd", *flags])


def test_the_host_budget_is_split_by_slots_and_every_instance_gets_its_share(ckpt):
    args = _args("--model", str(ckpt), "--kv-cache-memory-bytes", "40M", "--num-prefill", "2", "--num-decode", "4")
    shares = kv_shares(args)
    # 2 P x 8 slots + 4 D x 16 slots = 80 slot units of 0.5 MiB
    assert (shares.prefill_bytes, shares.decode_bytes) == (4 * 2 ** 20, 8 * 2 ** 20)
    # the prefill share holds 4 MiB / 512 B = 8192 positions, less the decode lookahead: both roles get that
    assert shares.max_model_len == 8192 - decode_lookahead(0)
    for role, share in (("prefill", shares.prefill_bytes), ("decode", shares.decode_bytes)):
        argv = _instance_argv(args, role, port=1, router_port=2, shares=shares)
        assert argv[-4:] == ["--kv-cache-memory-bytes", str(share), "--max-model-len", str(shares.max_model_len)]
    assert instance_flags_problem(args, shares) is None
    assert "KV budget 40.0 MiB from --kv-cache-memory-bytes 40.0 MiB" in shares.line


def test_without_a_flag_the_host_default_is_shared_not_taken_by_each(ckpt):
    shares = kv_shares(_args("--model", str(ckpt)))
    assert shares.prefill_bytes + shares.decode_bytes <= 4 * 2 ** 30
    assert (shares.prefill_bytes, shares.decode_bytes) == (4 * 2 ** 30 // 3, 8 * 2 ** 30 // 3)


def test_instances_that_size_their_own_cache_get_no_share(ckpt):
    assert kv_shares(_args("--model", "fd-tiny")) is None            # an embedded model: a few MiB
    assert kv_shares(_args("--model", str(ckpt), "--num-kv-blocks", "600")) is None


def test_a_share_too_small_is_refused_with_one_line_before_anything_starts(ckpt, capsys):
    code = main(["serve", "--pd", "--model", str(ckpt), "--kv-cache-memory-bytes", "300K", "--max-model-len", "512"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "prefill instance's share of the host's KV budget (100.0 KiB)" in err and "does not fit" in err, err
