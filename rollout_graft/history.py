"""TokenHistory: what every row has written so far, and suffix matching over a group's rows.

The adjacency index keys successors by one (or two) tokens, so it cannot tell *which* "= 16" a
sibling wrote. This keeps the text itself: one device buffer per row (prompt + committed
completion) and a vectorised longest-suffix matcher. A row's draft chain is the continuation
that followed the longest match of its last tokens in the text of the rows it may read: its
group's rows when sharing (siblings, the prompt included) or only its own text otherwise
(prompt lookup). No Python loop per row or per node: one batched comparison per step.

A sibling's text can only help where that sibling is *ahead*; in a lock-step batch siblings are
at about the same place, so the engine can start a group's leaders first (`EngineConfig.group_lead`),
and a prompt seen again (GRPO epochs) can read its earlier completions (`RetrievalConfig.recall`):
read-only rows after the rollout's own.
"""

from __future__ import annotations

import torch

PAD = -1  # buffer slot not written yet


class TokenHistory:
    """Per-row token buffers [rows, width] and the readable rows of each row.

    prompts: the distinct prompts; row_prompt: [rows] prompt of each row; width: buffer length
    (≥ longest text it must hold: prompt + max_new_tokens, or a recalled text; writes past it are
    dropped); recalled: earlier completions per group, read-only rows read right after the row
    itself (before siblings);
    share: a row reads its group's rows (else only itself); max_rows: rows one row reads at most
    (itself and the group's first others — a staggered rollout's leaders — which bounds the
    per-step work, [rows, max_rows, width] comparisons per suffix token, for very large groups).
    """

    def __init__(self, prompts: list[list[int]], row_prompt: torch.Tensor, width: int, share: bool,
                 device: torch.device | str, max_rows: int = 16, recalled: dict[int, list[list[int]]] | None = None):
        dev = torch.device(device)
        groups = row_prompt.tolist()
        self.row_prompts = [tuple(prompts[g]) for g in groups]  # prompt of each rollout row
        # rows first, then read-only rows: earlier completions of a group's prompt (`recalled[g]`)
        texts = [prompts[g] for g in groups]
        memory: dict[int, list[int]] = {}
        for g, completions in (recalled or {}).items():
            for c in completions:
                memory.setdefault(g, []).append(len(texts))
                texts.append(prompts[g] + c)
        # one spare column past `width`: `append` sends the slots it must not write there (no masked
        # indexing, so no host sync on a GPU); nothing reads it
        buf = torch.full((len(texts), width + 1), PAD, dtype=torch.long)
        for r, t in enumerate(texts):
            buf[r, : min(len(t), width)] = torch.tensor(t[:width], dtype=torch.long)
        self.buf = buf.to(dev)  # [rows + recalled, width + 1], built on the host, copied once
        self.length = torch.tensor([len(t) for t in texts], dtype=torch.long, device=dev).clamp(max=width)
        by_group: dict[int, list[int]] = {}
        for r, g in enumerate(groups):
            by_group.setdefault(g, []).append(r)
        # each row reads itself, then its prompt's recalled completions, then (sharing) its group's
        # first other rows, up to max_rows in all
        readable = []
        for r, g in enumerate(groups):
            others = [m for m in by_group[g][:max_rows] if m != r] if share else []
            readable.append(([r] + memory.get(g, []) + others)[:max_rows])
        size = max(len(x) for x in readable)
        self.readable = torch.tensor([x + [-1] * (size - len(x)) for x in readable], dtype=torch.long, device=dev)  # [rows, ≤max_rows]

    @property
    def width(self) -> int:
        return self.buf.shape[1] - 1

    def completions(self) -> list[tuple[tuple[int, ...], list[int]]]:
        """(prompt, what the row committed after it) for every rollout row (recalled rows excluded)."""
        rows = len(self.row_prompts)
        texts, lens = self.buf[:rows].tolist(), self.length[:rows].tolist()  # one transfer each
        return [(p, t[len(p):n]) for p, t, n in zip(self.row_prompts, texts, lens)]

    def append(self, rows: torch.Tensor, tokens: torch.Tensor, n: torch.Tensor) -> None:
        """Row rows[i] committed tokens[i, :n[i]]. rows, n: [A]; tokens: [A, T]."""
        t = torch.arange(tokens.shape[1], device=tokens.device).view(1, -1)
        slot = self.length[rows].view(-1, 1) + t  # [A, T]
        slot = torch.where((t < n.view(-1, 1)) & (slot < self.width), slot, self.width)  # else: the spare column
        self.buf[rows.view(-1, 1).expand_as(slot), slot] = tokens
        self.length[rows] = (self.length[rows] + n).clamp(max=self.width)

    def match(self, rows: torch.Tensor, max_match: int, depth: int, min_match: int = 1
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The continuation after the longest match of each row's last `max_match` tokens.

        rows: [A] rows to match for. Searches every readable row's text (own text included, but
        never the suffix itself), prefers the longest match, then the latest position.
        Returns chain [A, depth] tokens, valid [A, depth] (a prefix of each row), match length [A]
        (0: no match of at least `min_match` tokens).
        """
        a, n, dev = rows.numel(), max_match, self.buf.device
        own_len = self.length[rows]  # [A]
        sfx_pos = own_len.view(-1, 1) - n + torch.arange(n, device=dev).view(1, -1)  # [A, n] oldest first
        suffix = self.buf[rows.view(-1, 1), sfx_pos.clamp(min=0)].masked_fill(sfx_pos < 0, -2)  # -2 never matches
        cand = self.readable[rows]  # [A, G]
        width = int(self.length.max())  # only written slots can match (one host sync per step)
        text = self.buf[cand.clamp(min=0), :width]  # [A, G, W]
        # windows[..., j, :] = text[j - n + 1 .. j] (left-padded so that j runs over every position)
        padded = torch.cat([text.new_full((a, cand.shape[1], n - 1), -3), text], 2)
        eq = padded.unfold(2, n, 1) == suffix.view(a, 1, 1, n)  # [A, G, W, n]
        # match length ending at j: how many trailing tokens agree, counted from the newest backwards
        run = eq[..., n - 1]
        mlen = run.to(torch.int16)  # [A, G, W]
        for k in range(2, n + 1):
            run = run & eq[..., n - k]
            mlen += run
        cand_len = torch.where(cand >= 0, self.length[cand.clamp(min=0)], 0)  # [A, G]
        pos = torch.arange(width, device=dev).view(1, 1, -1)
        usable = pos + 1 < cand_len.unsqueeze(-1)  # a continuation exists (and not the suffix itself)
        mlen = mlen.masked_fill(~usable, 0)
        key = mlen.long() * (width + 1) + pos  # longest, then latest
        best = key.view(a, -1).argmax(1)  # [A]
        g_idx, j = best // width, best % width
        length = mlen.view(a, -1).gather(1, best.view(-1, 1)).squeeze(1)
        length = length.masked_fill(length < min_match, 0)
        src = cand.gather(1, g_idx.view(-1, 1)).squeeze(1).clamp(min=0)  # [A] row the chain is read from
        at = j.view(-1, 1) + 1 + torch.arange(depth, device=dev).view(1, -1)  # [A, depth]
        valid = (at < self.length[src].view(-1, 1)) & (length > 0).view(-1, 1)
        chain = self.buf[src.view(-1, 1), at.clamp(max=self.width - 1)].masked_fill(~valid, 0)
        return chain, valid, length
