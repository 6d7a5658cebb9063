"""Quality evals through the public API, shipped with the package so `memory-service eval` works from an install.

locomo (retrieval: does recall find the turns that answer a question? with locomo_baseline; the data
set's reader and metrics are in testbed/, which the embedders benchmark reads too), personaext
(extraction: does a stored fact keep the persona fact an utterance states?), and cli (`memory-service
eval`: picks the harness per data file and runs the service).
"""
