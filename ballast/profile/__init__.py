"""`ballast profile`: measure the real model with the real runtime, fit the cost model, check it.

    command.py   the CLI: flags -> Settings -> measure on ranks -> fit -> JSON (or --check)
    settings.py  what a profile measures: its settings and defaults, the grid and held-out points
    profiler.py  the profile itself: the points measured on ranks, fitted, checked, reported
    grid.py      what to measure: points of lengths x SP degrees x recompute levels x depths
    video_grid.py  a video model's points: clips that separate its attention terms, tiny packs
    sources.py   real lengths and clips: held-out points, a video grid's source packs, the check's
    measure.py   the points run for real on local ranks (or torchrun's), timed
    exchange.py  what a text model's all-to-alls exchange, checked on the ranks
    fit.py       the cost model's coefficients from the measurements, per layer (a video DiT's
                 attention by its pattern: spatial and temporal blocks apart; CP's own terms)
    noise.py     how the repeats' spread grows with a point's seconds: the fit's weights
    columns.py   the fit's columns: a point's blocks, spans, calls, tokens and exchanges
    coefficients.py  the fitted coefficients, and the CostModel they make at any depth
    residuals.py the points priced by the fitted model: errors and their summaries
    context.py   context parallelism: the splits profiled, their CP bytes, residuals per point
                 kind, the planners --check takes CP plans from
    check.py     random plans run for real against the profile's predictions
    drift.py     the machine's drift between the profile and its check (profile points again)
    machine.py   what the profile ran on, how loaded the machine was, its default device memory
"""
