"""Pricing: the cost model (time, exchanges, memory) and its sources, the NICs' load, Zeppelin's
remap domains and the lower bound. Imports the vocabulary only."""
