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


def test_replay_revisits_a_greedy_recording_on_a_modelled_clock(tmp_path):
    """`--revisit` replays each rollout as its own next epoch, timed the second time: recall drafts
    its earlier completion, so the revisit accepts more than a first visit. `--step-ms` adds D-cut
    on the modelled clock and each variant's modelled speed-up (a cut that drafts nothing is plain
    decoding's time plus the proposer's own); `--max-match` names a variant per longest context.
    A recording sampled at T > 0 is no revisit of itself: refused."""
    import pytest

    replay = load_script("lab/replay.py")
    prompts, outs = bench.completions(np.random.default_rng(0), 8, 1, 48)
    rollouts = [{"prompts": [p.tolist() for p in prompts], "completions": [o.tolist() for o in outs]}]
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"args": {"temperature": 0.0}, "vocab": bench.VOCAB, "rollouts": rollouts}))
    common = ["vllm", "run", str(rec), "--k", "6", "--taus", "0", "2", "--min-token-probs"]
    first = replay.main(common)["variants"]
    out = replay.main(common + ["--revisit", "--step-ms", "5", "0.1", "0.05", "--max-match", "2", "8"])
    v = out["variants"]
    assert set(v) == {"ours/m2@6/0", "ours/m2@6/2", "ours/m2+dcut@6", "ours/m8@6/0", "ours/m8@6/2", "ours/m8+dcut@6"}
    assert v["ours/m8@6/0"]["emitted"] == first["ours@6/0"]["emitted"]  # only the second visit counts
    assert v["ours/m8@6/0"]["mat"] > first["ours@6/0"]["mat"]
    assert 0.9 < v["ours/m8@6/2"]["modelled_speedup"] <= 1.0 and v["ours/m8@6/2"]["mat"] == 1.0
    assert v["ours/m8@6/0"]["modelled_speedup"] > 1.0
    assert out["command"] == "python lab/replay.py " + " ".join(common + ["--revisit", "--step-ms", "5", "0.1", "0.05",
                                                                         "--max-match", "2", "8"])
    rec.write_text(json.dumps({"args": {"temperature": 1.0}, "vocab": bench.VOCAB, "rollouts": rollouts}))
    with pytest.raises(SystemExit, match="greedy"):
        replay.main(common + ["--revisit"])


def test_counting_after_the_walk_changes_the_drafts_only():
    """The study `--count-after-walk` replays: a step after a drafting step walks its chains on the
    tables as the last step left them and counts its own text after. Every token is counted all the
    same (the tables end equal to the product's), the drafts lag: on synthetic GRPO groups the
    product drafts more accepted tokens, and the first step walks on counted prompts in both."""
    prompts, outs = bench.completions(np.random.default_rng(0), 16, 8, 64)
    props, drafts = [], []
    for after in (False, True):
        prop = bench.ours_proposer(6, 0.0, bench.VOCAB, 200, count_after_walk=after)
        drafts.append(bench.replay_rows(prop, prompts, outs))
        prop.tracker.count()
        props.append(prop)
    ours, after = props
    assert ours.store.table(ours.prior) == after.store.table(after.prior) and ours.store.table(ours.prior)
    assert drafts[0][0] == drafts[1][0] and drafts[0] != drafts[1]
    assert ours.stats.accepted_tokens > after.stats.accepted_tokens
