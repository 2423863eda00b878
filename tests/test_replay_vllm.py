"""lab/replay.py vllm: chain proposers replayed on recorded rollouts (no model, no vLLM engine)."""

import json

import numpy as np
from conftest import load_script

import rollout_graft_tools.chain_replay as bench


def test_replay_counts_and_score_cut(tmp_path):
    """On a recording (synthetic GRPO groups), our proposer's chains cut at a higher raw score
    draft fewer tokens per step; MAT is 1 + accepted per step, accepted ≤ drafted, and a cut that
    keeps nothing is plain decoding."""
    replay = load_script("lab/replay.py")
    prompts, outs = bench.completions(np.random.default_rng(0), 16, 8, 48)
    lengths = np.random.default_rng(1).integers(8, 48, len(outs))  # EOS: completions of their own lengths
    rollouts = [{"prompts": [p.tolist() for p in prompts], "completions": [o[:n].tolist() for o, n in zip(outs, lengths)]}]
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"args": {}, "vocab": bench.VOCAB, "rollouts": rollouts}))
    out = replay.main(["vllm", "run", str(rec), "--k", "6", "--taus", "0", "0.3", "2", "--min-token-probs", "--json",
                       str(tmp_path / "out.json")])
    v = out["variants"]
    drafted = [v[f"ours@6/{t}"]["drafted_per_step"] for t in ("0", "0.3", "2")]
    assert drafted[0] > drafted[1] > drafted[2] == 0
    for r in v.values():
        assert r["emitted"] == int(lengths.sum()) and r["accepted"] <= r["drafted"]
        assert r["mat"] == 1 + r["accepted_per_step"]
    assert v["ours@6/0"]["mat"] > 1.5 and v["ours@6/2"]["mat"] == 1.0
    assert json.loads((tmp_path / "out.json").read_text())["suffix_vs_ours"] == {}
