"""Which Slurm a job goes to (kit.targets.select_target) for an ordinary user: root's local cluster of the
machine when one runs (their login shell through `ssh host cmd` has no SLURM_CONF), else, as on a site's login
node whose Slurm configuration is elsewhere, a hint to set SLURM_CONF — never "kit cluster up", which is root's."""

from __future__ import annotations

import os

import pytest

from kit import targets
from kit.cluster import public
from kit.errors import KitError


@pytest.fixture
def ordinary(monkeypatch, tmp_path):
    """An ordinary user's process with no SLURM_CONF, no site slurm.conf and no local cluster of their own."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv("KIT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(targets, "SITE_CONFS", (str(tmp_path / "etc-slurm.conf"),))


def test_an_ordinary_user_without_slurm_is_told_to_set_slurm_conf(ordinary, monkeypatch, tmp_path):
    monkeypatch.setattr(public, "clusters", lambda: [])
    with pytest.raises(KitError) as e:
        targets.select_target(None)
    assert e.value.message == (
        "no Slurm to submit to: no slurm.conf in SLURM_CONF or the usual places "
        f"({tmp_path / 'etc-slurm.conf'}), and no local cluster runs on this machine"
    )
    assert e.value.hint.startswith("set SLURM_CONF to your site's slurm.conf") and "cluster up" not in e.value.hint


def test_an_ordinary_user_submits_to_roots_local_cluster_of_the_machine(ordinary, monkeypatch, tmp_path):
    conf = tmp_path / "cluster-abc" / "slurm.conf"
    monkeypatch.setattr(public, "clusters", lambda: [conf])
    target, note = targets.select_target(None)
    assert (target.conf, target.name) == (str(conf), "site")
    assert note == f"no site Slurm configured: using this machine's local cluster ({conf})"


def test_root_without_slurm_is_told_to_start_a_cluster(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv("KIT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(targets, "SITE_CONFS", (str(tmp_path / "etc-slurm.conf"),))
    monkeypatch.setattr(
        public, "clusters", lambda: [tmp_path / "another-roots" / "slurm.conf"]
    )  # not believed for root
    with pytest.raises(KitError) as e:
        targets.select_target(None)
    assert "kit cluster up" in e.value.hint
