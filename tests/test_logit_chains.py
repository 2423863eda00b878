"""The logit-chain replay study (`rollout_graft_tools.logit_chains`) on hand-written token arrays."""

from types import SimpleNamespace

import numpy as np
import torch

from rollout_graft import SamplingParams
from rollout_graft.dcut.chains import cut
from rollout_graft_tools.chain_replay import replay_rows, request_id
from rollout_graft_tools.logit_chains import Calibration, LogitChainProposer, OffPathLogitChains, ScoreThreshold, at_drafted
from rollout_graft_tools.replay import Recording

V = 16


def recording(prompts: list[list[int]], completions: list[list[int]], groups: list[int], succ: dict[int, list[int]],
              probs=(0.9, 0.1)) -> Recording:
    """A recording whose target puts `probs` on succ[t] after token t (rows, positions as `record` lays them)."""
    def top(tokens):  # the distribution after each of `tokens`
        ids = torch.tensor([succ.get(t, [0, 1]) for t in tokens], dtype=torch.int32)
        return ids, torch.tensor([list(probs)] * len(tokens), dtype=torch.float32)

    rows_after = [prompts[g][-1:] + c for g, c in zip(groups, completions)]  # L + 1 positions per row
    top_ids, top_probs = top([t for r in rows_after for t in r])
    p_ids, p_probs = top([t for p in prompts for t in p[:-1]])
    offsets = lambda seqs: torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)  # noqa: E731
    return Recording(
        prompt_ids=torch.tensor([t for p in prompts for t in p]), prompt_offsets=offsets(prompts),
        row_group=torch.tensor(groups), completion_ids=torch.tensor([t for c in completions for t in c]),
        completion_offsets=offsets(completions), prompt_top_ids=p_ids, prompt_top_probs=p_probs,
        top_ids=top_ids, top_probs=top_probs, warped_probs=top_probs.half(),
        params=SamplingParams(temperature=1.0), model="hand-written", vocab=V)


class FixedDrafts:
    """Proposer stub: the i-th call drafts drafts[i] for every row."""

    def __init__(self, drafts):
        self.drafts, self.calls, self.max_model_len = drafts, 0, 32

    def propose(self, sampled, num, token_ids):
        d = self.drafts[min(self.calls, len(self.drafts) - 1)]
        self.calls += 1
        return [list(d) for _ in sampled]


def test_replay_step_accepts_the_matching_prefix_plus_one():
    counts = dict.fromkeys(("steps", "emitted", "drafted", "accepted"), 0)
    # completion 5 6 7 8 9; prefill emits 5; step 1 drafts 6 7 0 → accepts 6 7 (+ bonus 8);
    # step 2 drafts 3 → accepts none (+ bonus 9), the row is done
    replay_rows(FixedDrafts([[6, 7, 0], [3]]), [[1, 2]], [[5, 6, 7, 8, 9]], record=False, counts=counts)
    assert counts == {"steps": 3, "emitted": 5, "drafted": 4, "accepted": 2}


def test_replay_never_accepts_the_last_token_as_a_draft():
    counts = dict.fromkeys(("steps", "emitted", "drafted", "accepted"), 0)
    # completion 5 6 7: a draft 6 7 matches it all, but the last token is the step's bonus token
    replay_rows(FixedDrafts([[6, 7]]), [[1, 2]], [[5, 6, 7]], record=False, counts=counts)
    assert counts == {"steps": 2, "emitted": 3, "drafted": 2, "accepted": 1}


def test_logit_chain_drafts_the_best_successors_its_group_learned():
    # the target: 2 → 3 → 4 → 5 → 6 (0.9 each); one group of two rows with prompt 1 2
    rec = recording([[1, 2]], [[3, 4, 5, 6], [3, 4, 5, 6]], [0, 0], {2: [3, 9], 3: [4, 9], 4: [5, 9], 5: [6, 9]})
    prop = LogitChainProposer(k=3, max_model_len=32, vocab=V, use_prior=False)
    prop.start(rec)
    prop.set_requests([request_id(0, 0), request_id(0, 1)], [2, 2])
    token_ids = np.zeros((2, 32), dtype=np.int32)
    token_ids[0, :6] = [1, 2, 3, 4, 5, 6]  # row 0 emitted all of 3 4 5 6: positions 0..3 are learned
    token_ids[1, :3] = [1, 2, 3]  # row 1 emitted 3: its next chain reads what row 0 taught the group
    tokens, scores = prop.draft(np.array([6, 3]), token_ids)
    assert tokens[1] == [4, 5, 6]  # 3 → 4 → 5 → 6
    np.testing.assert_allclose(scores[1], [0.9, 0.81, 0.729], rtol=1e-3)  # prefix products
    assert tokens[0] == []  # nothing learned after 6 (its distribution is not verified yet)
    assert prop.learned == [4, 1]  # positions learned per request: those its verified steps computed


def test_logit_chain_backs_off_to_the_prior_and_cuts_by_score():
    # group 0 learns 3 → 4 → 5; group 1 knows nothing and reads the global prior
    rec = recording([[1, 2], [7, 2]], [[3, 4, 5], [3]], [0, 1], {2: [3, 9], 3: [4, 9], 4: [5, 9]}, probs=(0.6, 0.4))
    prop = LogitChainProposer(k=4, max_model_len=32, vocab=V, policy=ScoreThreshold(4, 0.5))
    prop.start(rec)
    prop.set_requests([request_id(0, 0), request_id(0, 1)], [2, 2])
    token_ids = np.zeros((2, 32), dtype=np.int32)
    token_ids[0, :5] = [1, 2, 3, 4, 5]
    token_ids[1, :3] = [7, 2, 3]
    tokens, scores = prop.draft(np.array([5, 3]), token_ids)
    assert tokens[1] == [4, 5]  # from the prior: 3 → 4 (0.6) → 5 (0.36); nothing after 5 yet
    sent = cut(tokens, prop.policy.cut(tokens, scores)[0])
    assert sent[1] == [4]  # τ = 0.5 keeps the first token only (0.6 ≥ 0.5 > 0.36)


def test_offpath_learns_the_positions_past_a_rejected_token():
    def model(input_ids, use_cache):  # a target that always follows t with t + 1
        return SimpleNamespace(logits=torch.nn.functional.one_hot((input_ids + 1) % V, V).float() * 10)

    rec = recording([[1, 2]], [[3, 4, 5]], [0], {})
    prop = OffPathLogitChains(model, k=3, max_model_len=32, vocab=V, use_prior=False)
    prop.start(rec)
    prop.set_requests([request_id(0, 0)], [2])
    prop.learned = [1]  # position 0 (after 2) learned at the first call
    prop.sent = {0: (1, [9, 10])}  # a chain sent after token 3; the step emitted 4 (9 rejected)
    prop.learn_emitted(np.array([4]))
    assert prop.index.ids[0, 3, 0] == 0  # on-path: after 3 the recording's successor (0 for an unknown token)
    assert prop.index.ids[0, 9, 0] == 10 and prop.index.ids[0, 10, 0] == 11  # off-path: after 9 and after 10


def test_calibration_learns_acceptance_per_score_bin():
    cal = Calibration(bins=2, pseudo=1.0)
    chains = ([[4, 5]] * 4, np.array([[0.9, 0.8]] * 4))
    cal.update(chains, [[4, 0, 0]] * 4)  # the first token is always accepted, the second never
    assert cal.seen[1] == 8 and cal.hits[1] == 4  # both tokens fall in the upper bin: 4 hits in 8
    # (hits + pseudo · raw) / (seen + pseudo): shrunk to the raw score; 0 past the chain's end
    np.testing.assert_allclose(cal(np.array([[0.9, 0.8, 0.0]])), [[4.9 / 9, 4.8 / 9, 0.0]])


def test_at_drafted_reads_the_upper_frontier_from_no_drafting():
    points = [{"drafted_per_step": 2.0, "mat": 1.5}, {"drafted_per_step": 3.0, "mat": 1.4},
              {"drafted_per_step": 4.0, "mat": 1.7}]
    assert at_drafted(points, 1.0) == 1.25  # between (0, 1) and (2, 1.5)
    assert abs(at_drafted(points, 3.0) - 1.6) < 1e-9  # (3, 1.4) is below the frontier
    assert at_drafted(points, 5.0) is None
