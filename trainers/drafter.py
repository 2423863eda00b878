"""Draft-model checks: a drafter proposes token *ids* that the policy verifies, so both must
use the same tokenizer (same vocabulary, same ids, same EOS)."""

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def check_same_tokenizer(policy: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase, draft_name: str) -> None:
    """ValueError unless `draft` maps every token to the same id as `policy`."""
    policy_vocab, draft_vocab = policy.get_vocab(), draft.get_vocab()
    differ = sorted(t for t in policy_vocab.keys() | draft_vocab.keys() if policy_vocab.get(t) != draft_vocab.get(t))
    if differ or policy.eos_token_id != draft.eos_token_id:
        detail = (f"{len(differ)} tokens differ, e.g. {differ[:3]}" if differ
                  else f"EOS id {draft.eos_token_id} vs {policy.eos_token_id}")
        raise ValueError(
            f"the draft model {draft_name} uses another tokenizer than the policy ({len(draft_vocab)} vs "
            f"{len(policy_vocab)} tokens; {detail}). Draft tokens are verified by id, so pick a draft model "
            "trained with the policy's tokenizer (same model family)."
        )


def check_drafter(policy_tokenizer: PreTrainedTokenizerBase, draft_model_name_or_path: str) -> None:
    """Load the drafter's tokenizer from its local directory and check it against the policy's."""
    draft = AutoTokenizer.from_pretrained(draft_model_name_or_path)
    check_same_tokenizer(policy_tokenizer, draft, draft_model_name_or_path)
