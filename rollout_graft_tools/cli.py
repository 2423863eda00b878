"""What the user scripts' command lines share (argparse types)."""

from __future__ import annotations

import argparse


def positive(text: str) -> int:
    """An argparse `type`: an int of 1 or more (a count), else argparse's one-line error."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: 1 or more")
    return value
