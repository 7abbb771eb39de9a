"""Optional: a clip run by several processes that split every frame's rows (`row_bands.RowBands`) and
the worker processes that host them (`workers.RankWorkers`). The engine's default partition is the
whole frame in one process (`run.strategies.WHOLE_FRAME`).
"""
