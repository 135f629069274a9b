"""torch_seeded: one seeded block at a time across threads."""

from __future__ import annotations

import threading
import time

import torch

from dpcore.torch.seeding import torch_seeded


def test_torch_seeded_keeps_other_threads_out_of_a_seeded_block() -> None:
    """A second thread seeding meanwhile must wait: the first block draws what it seeded."""
    with torch_seeded(1):
        expected = torch.rand(3)
    entered, drawn = threading.Event(), []

    def first() -> None:
        with torch_seeded(1):
            entered.set()
            time.sleep(0.3)  # the other thread tries to seed now
            drawn.append(torch.rand(3))

    def second() -> None:
        entered.wait()
        with torch_seeded(2):
            torch.rand(3)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert torch.equal(drawn[0], expected)
