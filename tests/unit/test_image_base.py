"""scripts/build-image.sh --worker-base: the worker built on a CUDA base is labelled with that base, so the same
command with --push keeps it instead of rebuilding it on the CPU base (docs/lab-rack.md's images step)."""
from __future__ import annotations

import docker
import pytest

from containers import image


class Img:
    def __init__(self, id_: str, labels: dict | None = None):
        self.id, self.labels = id_, labels or {}


class Images:
    def __init__(self):
        self.store = {"pytorch/cuda:1": Img("sha256:cuda"), image.BASE_IMAGE: Img("sha256:cpu", {
            image.LABEL: image.base_inputs()})}
        self.builds = []

    def get(self, name):
        if name not in self.store:
            raise docker.errors.ImageNotFound(name)
        return self.store[name]

    def build(self, **kw):
        self.builds.append(kw["buildargs"]["BASE"])
        self.store[kw["tag"]] = Img("sha256:worker", kw["labels"])


class Client:
    def __init__(self):
        self.images = Images()


@pytest.fixture
def client(monkeypatch):
    c = Client()
    monkeypatch.setattr(docker, "from_env", lambda: c)
    monkeypatch.setattr(image, "ensure_helper", lambda *a, **k: True)
    return c


def test_the_worker_on_a_cuda_base_is_kept_by_the_same_command_again(client):
    assert image.ensure_images(worker_base="pytorch/cuda:1")
    assert client.images.builds == ["pytorch/cuda:1"]
    assert image.ensure_images(worker_base="pytorch/cuda:1")  # as `--worker-base ... --push` runs it again
    assert client.images.builds == ["pytorch/cuda:1"]  # not rebuilt
    assert image.ensure_images()  # without it: the emulated rack's CPU worker, rebuilt on optirack-base
    assert client.images.builds == ["pytorch/cuda:1", image.BASE_IMAGE]


def test_a_worker_base_that_is_not_on_the_engine_is_named(client):
    with pytest.raises(SystemExit, match="--worker-base nothing:1: no such image"):
        image.ensure_images(worker_base="nothing:1")
    assert client.images.builds == []
