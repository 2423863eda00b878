"""Draft sources behind one `Proposer` interface."""

from .base import NoProposer, Proposer, StepContext
from .retrieval import RetrievalProposer

__all__ = ["NoProposer", "Proposer", "RetrievalProposer", "StepContext"]
