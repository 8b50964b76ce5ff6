"""What every process the engine starts with subprocess does first (the tensor-parallel ranks,
distributed/worker.py; the grammar processes, structured/grammar_child.py): it leaves Ctrl-C to
the engine and ends once the engine is gone."""

from __future__ import annotations

import os
import signal
import threading
import time


def become_engine_child(name: str) -> None:
    """Ignore SIGINT (Ctrl-C reaches the whole group: the engine stops its children) and start a
    thread, `name`, that ends this process once its parent is gone, even where the main thread
    waits inside a collective for a rank that will never come."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name=name, daemon=True).start()
