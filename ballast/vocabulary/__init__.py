"""The planning vocabulary: what planners, pricing and runtime talk about (samples, attention
patterns and layouts, clips, clusters and their NICs, model shapes) and the checks that read them
from users' files. Imports nothing above it."""
