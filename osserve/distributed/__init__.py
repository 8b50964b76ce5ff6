"""Tensor and expert parallelism: one model over N ranks of one host (`--tensor-parallel-size N`).

layout.py     which heads, experts and expert columns a rank holds (and the start-up checks)
sharding.py   how each checkpoint tensor is cut for a rank (loader and dummy weights alike)
collectives.py  the ranks' process group: rendezvous, all-reduce, broadcast
expert_routing.py  expert parallelism: a rank's view of the router's choices
messages.py   what goes down the pipes to the worker processes (a step's inputs)
workers.py    the worker processes, seen from the engine: start, send, watch for deaths
parallel_runner.py  rank 0's ModelRunner: each step to every rank, then its own forward
worker.py     a worker process's main: build its rank, then run the steps it is sent
"""
