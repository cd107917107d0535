"""A rank of a real Ray Train job (TorchTrainer, gloo on CPU) is SIGKILLed: its rank comes from Ray Train.

Ray Train sets RANK inside the worker after start-up, so neither the
runtime_env nor the name has it: the dead worker's rank is read from Ray
Train's structured worker logs on its node (through the node agent).
"""

from __future__ import annotations

import time
import uuid


def test_ray_train_rank_of_a_sigkilled_worker(ray_cluster, tmp_path):
    from raysleuth.deaths import find_deaths
    from victims import train_deaths

    tag = f"train-{uuid.uuid4().hex[:6]}"
    error = train_deaths.run(victim=1, workers=2, tag=tag, storage=str(tmp_path))
    assert error is not None, "fit() should fail when rank 1 dies"
    deadline = time.time() + 60
    while True:
        report = find_deaths()
        mine = [death for death in report.deaths if death.actor_class == "RayTrainWorker"
                and any(tag in line for line in death.last_stdout)]
        if len(mine) >= 2 or time.time() > deadline:
            break
        time.sleep(1)
    by_rank = {death.rank: death for death in mine}
    assert set(by_rank) == {0, 1}, [(d.rank, d.rank_source, d.cause) for d in mine]
    victim = by_rank[1]
    assert victim.rank_source == "ray train" and victim.cause == "sigkill", victim.evidence
    assert any(f"{tag} rank 1 step 2" in line for line in victim.last_stdout)
    assert by_rank[0].cause == "ray_kill"  # Ray Train tore the group down after rank 1 died
