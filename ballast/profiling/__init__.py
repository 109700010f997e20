"""The profiler behind `ballast profile`: grid (what to measure), measure (the real runtime on
local ranks), fit (DESIGN.md's coefficients, per layer), check (random plans, predicted vs
measured), machine (what it ran on and how loaded it was)."""
