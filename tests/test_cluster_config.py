"""What `kit cluster up` generates, for kit's stand-in and for real pyxis + enroot,
pinned by golden files that need neither installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import require

from kit.cluster import accounting, config

GOLDEN = Path(__file__).parent / "golden" / "cluster"
ACCEPT = "KIT_ACCEPT_GOLDEN=1 python -m pytest tests/test_cluster_config.py"
ROOT = Path("/home/alice/.local/state/kit/cluster")
SHAPE = SimpleNamespace(
    nodes=2,
    cpus_per_node=4,
    gpus_per_node=2,
    memory_mb=8000,
    hostname="login1",
    ctld_port=6817,
    node_ports=[6818, 6819],
)
PYXIS_SO = "/usr/local/lib/slurm/spank_pyxis.so"
ACCOUNTED = SimpleNamespace(**vars(SHAPE), auth="munge", dbd_port=6820)


def generated() -> dict[str, str]:
    return {
        "slurm.conf": config.slurm_conf(SHAPE, ROOT, "alice", 17),
        "slurm.munge.conf": config.slurm_conf(
            SimpleNamespace(**vars(SHAPE), auth="munge", nodes_bound=True), ROOT, "alice", 17
        ),
        "slurm.accounting.conf": config.slurm_conf(ACCOUNTED, ROOT, "alice", 17),
        "slurmdbd.conf": accounting.slurmdbd_conf(ACCOUNTED, ROOT, "alice", config.auth_lines(ACCOUNTED, ROOT)),
        "gres.conf": config.gres_conf(SHAPE, ROOT),
        "plugstack.pyxis.conf": config.plugstack_conf(config.PYXIS, ROOT, PYXIS_SO),
        "plugstack.kit-pyxis.conf": config.plugstack_conf(config.STAND_IN, ROOT, f"{ROOT}/spank_kit_pyxis.so"),
        "plugstack.none.conf": config.plugstack_conf(None, ROOT, None),
        "enroot.node1.sh": config.enroot_wrapper(ROOT, "node1", "/usr/bin/enroot"),
        "enroot.node2.sh": config.enroot_wrapper(ROOT, "node2", "/opt/enroot 4/bin/enroot"),
        "prolog.sh": config.prolog(ROOT, enroot=True, regen=ROOT / "prometheus" / "regen"),
    }


@pytest.mark.parametrize("name", sorted(generated()))
def test_golden(name):
    text = generated()[name]
    path = GOLDEN / name
    if os.environ.get("KIT_ACCEPT_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; create it with: {ACCEPT}"
    assert text == path.read_text(), f"{name} changed; if that is intended, accept it with: {ACCEPT}"


def test_plugin_choice():
    """Real pyxis only with enroot beside it; else the stand-in when it can be built; else none."""
    assert config.choose_containers(PYXIS_SO, "/usr/bin/enroot", True) == "pyxis"
    assert config.choose_containers(PYXIS_SO, "/usr/bin/enroot", False) == "pyxis"
    assert config.choose_containers(PYXIS_SO, None, True) == "kit-pyxis"
    assert config.choose_containers(None, "/usr/bin/enroot", True) == "kit-pyxis"
    assert config.choose_containers(None, None, False) is None


def test_slurm_conf_keeps_slurms_killwait_and_pyxis_gets_a_runtime_path_of_its_own():
    conf = generated()["slurm.conf"]
    assert "KillWait" not in conf  # Slurm's default, 30 s: room for pyxis's enroot remove
    assert f"PlugStackConfig={ROOT}/plugstack.conf" in conf
    assert (
        generated()["plugstack.pyxis.conf"].splitlines()[1] == f"required {PYXIS_SO} runtime_path={ROOT}/enroot/pyxis"
    )
    # Every node runs the prolog (each job user's own Prometheus targets directory; under real pyxis their enroot
    # directory too).
    pyxis = config.slurm_conf(SimpleNamespace(**vars(SHAPE), containers="pyxis"), ROOT, "alice", 17)
    assert f"Prolog={ROOT}/prolog" in pyxis.splitlines() and f"Prolog={ROOT}/prolog" in conf.splitlines()


def test_the_enroot_wrapper_gives_each_node_its_own_paths_and_enroot_its_helpers(tmp_path):
    """The wrapper first on node2's PATH hands the real enroot node2's directories, from a
    bare environment, and puts enroot's own directory on PATH for its helpers."""
    require("shellcheck")
    real = tmp_path / "real bin" / "enroot"
    real.parent.mkdir()
    real.write_text('#!/bin/sh\necho "args=$*"\nenv | grep ^ENROOT_ | sort\nenroot-nsenter\n')
    real.chmod(0o755)
    # enroot's helpers live beside it: found from a PATH without that directory.
    helper = real.parent / "enroot-nsenter"
    helper.write_text('#!/bin/sh\necho "helper found"\n')
    helper.chmod(0o755)
    root = tmp_path / "cluster"  # the cluster's public directory
    for node in ("node1", "node2"):
        wrapper = config.enroot_bin(root, node) / "enroot"
        wrapper.parent.mkdir(parents=True)
        wrapper.write_text(config.enroot_wrapper(root, node, str(real)))
        wrapper.chmod(0o755)
        subprocess.run(["bash", "-n", str(wrapper)], check=True)
        lint = subprocess.run(["shellcheck", "--severity=style", str(wrapper)], capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout
    path = f"{config.enroot_bin(root, 'node2')}:/usr/bin:/bin"
    out = subprocess.run(
        ["env", "-i", f"PATH={path}", "enroot", "create", "--name", "pyxis_1.0", "x y.sqsh"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    mine = f"{root}/enroot/node2/user-{os.getuid()}"  # the user's own, which the prolog makes
    assert out == [
        "args=create --name pyxis_1.0 x y.sqsh",
        f"ENROOT_CACHE_PATH={mine}/cache",
        f"ENROOT_DATA_PATH={mine}/data",
        f"ENROOT_RUNTIME_PATH={mine}/runtime",
        "helper found",
    ]


def test_the_prolog_makes_each_job_users_own_directories_where_only_root_writes(tmp_path):
    """The prolog (root, before a job's first step on a node): under real pyxis user-UID in the node's enroot
    directory, theirs and 0700; where the cluster runs Prometheus, the user's targets directory by name, theirs and
    0755. Each made once (a second run, or a second job beside it, leaves it as it is); nothing for what is not a
    uid, a user name and a node name. The directories they are made in are root's alone, so no user makes
    another's first."""
    require("shellcheck")
    if os.geteuid() != 0:
        pytest.skip("the prolog runs as root (slurmd's)")
    public = tmp_path / "public dir"
    (public / "enroot" / "node2").mkdir(parents=True)
    (public / config.TARGETS).mkdir()
    script = public / "prolog"
    script.write_text(config.prolog(public, enroot=True, regen=tmp_path / "no-regen"))
    script.chmod(0o755)
    lint = subprocess.run(["shellcheck", "--severity=style", str(script)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout

    def run(uid: str, node: str = "node2", user: str = "alice") -> int:
        env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_UID": uid, "SLURM_JOB_GID": "4321", "SLURMD_NODENAME": node}
        return subprocess.run([str(script)], env={**env, "SLURM_JOB_USER": user}).returncode

    mine = public / "enroot" / "node2" / "user-1234"
    assert run("1234") == 0
    info = mine.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (1234, 4321, 0o700)
    (mine / "data").mkdir()  # enroot's, as the user
    assert run("1234") == 0 and (mine / "data").is_dir()
    for uid, node in (("../1", "node2"), ("", "node2"), ("5", "../node2"), ("5", "")):
        assert run(uid, node) == 0
    assert sorted(p.name for p in (public / "enroot").rglob("*")) == ["data", "node2", "user-1234"]
    targets = (public / config.TARGETS / "alice").stat()
    assert (targets.st_uid, targets.st_gid, targets.st_mode & 0o7777) == (1234, 4321, 0o755)
    for user in ("../root", ".hidden", "a/b", ""):
        assert run("77", "node1", user) == 0
    assert sorted(p.name for p in (public / config.TARGETS).iterdir()) == ["alice"]


def test_each_slurmd_under_pyxis_starts_with_its_wrapper_first_on_path():
    conf = ROOT / "slurm.conf"
    assert config.daemon_env(ROOT, conf, "node2", "pyxis", "/usr/bin:/bin") == {
        "SLURM_CONF": str(conf),
        "PATH": f"{ROOT}/enroot/node2/bin:/usr/bin:/bin",
    }
    assert config.daemon_env(ROOT, conf, "slurmctld", "pyxis", "/usr/bin") == {"SLURM_CONF": str(conf)}
    # The stand-in keeps named containers where enroot would: the node's data path.
    assert config.daemon_env(ROOT, conf, "node1", "kit-pyxis", "/usr/bin") == {
        "SLURM_CONF": str(conf),
        "KIT_PYXIS_DATA": f"{ROOT}/enroot/node1/data",
    }


def test_kit_reads_the_sites_pyxis_settings_from_plugstack_conf_and_its_includes(tmp_path):
    """What kit reads of a site's pyxis (kit.slurm.pyxis.plugstack_settings): the pyxis line's settings,
    found through `include` globs, comments left out; None where the file cannot be read or loads no pyxis;
    and whether a named container is removed by the job epilog (container_scope=job, not squashfuse)."""
    from kit.cluster import config
    from kit.slurm import pyxis

    (tmp_path / "plugstack.conf.d").mkdir()
    (tmp_path / "plugstack.conf").write_text(
        "# site plugins\nrequired /usr/lib/spank_other.so x=1\ninclude plugstack.conf.d/*.conf  # pyxis's own file\n"
    )
    (tmp_path / "plugstack.conf.d" / "pyxis.conf").write_text(
        "optional /usr/local/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis container_scope=job # scope\n"
    )
    settings = pyxis.plugstack_settings(tmp_path / "plugstack.conf")
    assert settings == {"runtime_path": "/run/pyxis", "container_scope": "job"}
    assert pyxis.epilog_removes(settings)
    assert not pyxis.epilog_removes({**settings, "use_squashfuse": "true"})
    assert pyxis.epilog_removes({**settings, "use_squashfuse": "0"})
    assert not pyxis.epilog_removes({"container_scope": "global"}) and not pyxis.epilog_removes(None)
    assert pyxis.plugstack_settings(tmp_path / "missing.conf") is None
    (tmp_path / "other.conf").write_text("required /usr/lib/spank_other.so\n")
    assert pyxis.plugstack_settings(tmp_path / "other.conf") is None
    # kit's own cluster says what kit's launches read, for real pyxis and the stand-in
    for containers, plugin in ((config.PYXIS, "/opt/lib/spank_pyxis.so"), (config.STAND_IN, "/c/spank_kit_pyxis.so")):
        for squashfuse in (False, True):
            (tmp_path / "kit.conf").write_text(config.plugstack_conf(containers, tmp_path, plugin, squashfuse, "job"))
            assert pyxis.epilog_removes(pyxis.plugstack_settings(tmp_path / "kit.conf")) is not squashfuse
        (tmp_path / "kit.conf").write_text(config.plugstack_conf(containers, tmp_path, plugin))
        assert not pyxis.epilog_removes(pyxis.plugstack_settings(tmp_path / "kit.conf"))


def test_auth_none_only_where_every_port_is_loopbacks():
    """Without munged Slurm trusts the uid a client claims: the cluster starts so only where its nodes
    bind loopback (the host name resolves there, no isolated network); else one line with the fix."""
    import pytest

    from kit.errors import KitError

    said = []
    local = SimpleNamespace(hostname="localhost", network=None)
    config.choose_auth(local, False, said.append)
    assert (local.auth, local.nodes_bound) == ("none", True) and "munged not found" in said[0]
    for st in (
        SimpleNamespace(hostname="203.0.113.9", network=None),
        SimpleNamespace(hostname="localhost", network={"host": "198.18.0.1"}),
    ):
        config.choose_auth(st, True, said.append)
        assert st.auth == "munge" and st.nodes_bound is False
        with pytest.raises(KitError) as e:
            config.choose_auth(st, False, said.append)
        assert (
            str(e.value).startswith("munged not found, and the nodes would listen ")
            and "apt-get install -y munge" in e.value.hint
        )
    assert config.loopback_host("127.0.0.1") and not config.loopback_host("127.0.1.1")  # NodeAddr's alone
    assert not config.loopback_host("no-such-host.invalid")


def test_the_stand_in_is_one_file_per_context_and_exports_only_its_entry_points(tmp_path):
    """The stand-in's code shows its contexts, as pyxis's does: root's (slurmstepd.c) and the user's (task.c) apart,
    every file saying where it runs; built as kit cluster up builds it, it exports the SPANK entry points alone (its
    helpers hidden: slurmstepd's own symbols of the same names must not bind to them)."""
    from kit.cluster import plugin

    require("gcc")
    spank = Path(plugin.__file__).parent / "spank"
    sources = sorted(spank.glob("*.c"))
    assert [s.name for s in sources] == [
        "args.c", "common.c", "fuse.c", "image.c", "mounts.c", "rootfs.c", "slurmstepd.c", "task.c",
    ]  # fmt: skip
    assert "AS ROOT" in (spank / "slurmstepd.c").read_text()[:400]
    assert "AS THE JOB'S USER" in (spank / "task.c").read_text()[:400]
    for source in sources:  # each says what it is and where it runs, before its first line of code
        text = source.read_text()
        assert text.startswith("/*\n") and f" * {source.name}: " in text[: text.index("#include")], source
    assert max(len(s.read_text().splitlines()) for s in sources) <= 300  # no file holds two concepts' worth
    out = tmp_path / "kit_pyxis.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(out), *map(str, sources)], check=True
    )
    exported = subprocess.run(["nm", "-D", "--defined-only", str(out)], capture_output=True, text=True, check=True)
    names = sorted(line.split()[-1] for line in exported.stdout.splitlines() if not line.split()[-1].startswith("_"))
    assert names == [
        "plugin_name", "plugin_type", "plugin_version", "slurm_spank_exit", "slurm_spank_init",
        "slurm_spank_init_post_opt", "slurm_spank_job_epilog", "slurm_spank_task_init", "spank_plugin_version",
    ], names  # fmt: skip


def test_a_shells_slurm_conf_chooses_among_several_local_clusters(tmp_path, monkeypatch):
    """Two local clusters of root's on one machine: `kit cluster env` took the newest even when the shell's
    SLURM_CONF named the other, moving the user's shell onto another cluster. A set SLURM_CONF is honoured; one is
    chosen by id; without either the newest is used and that is said; status lists them all."""
    import time as clock

    from click.testing import CliRunner

    from kit.cli import cli
    from kit.cluster import public
    from kit.errors import KitError

    monkeypatch.setattr(public, "MACHINE", tmp_path / "run-kit")
    confs = []
    for name in ("cluster-aaaaaaaaaaaa", "cluster-bbbbbbbbbbbb"):  # b made last: the newest
        (public.MACHINE / name).mkdir(parents=True)
        conf = public.MACHINE / name / "slurm.conf"
        conf.write_text("ClusterName=x\n")
        confs.append(conf)
        clock.sleep(0.02)
    older, newest = confs
    own = (tmp_path / "own" / "slurm.conf", False)
    assert public.serving(*own, env_conf=str(older)) == (older, None)
    conf, note = public.serving(*own)
    assert conf == newest and "2 local clusters run on this machine: using the newest, bbbbbbbbbbbb" in note
    assert public.serving(*own, chosen="aaaaaaaaaaaa") == (older, None)
    with pytest.raises(KitError, match="no local cluster 'cccc' runs"):
        public.serving(*own, chosen="cccc")
    assert public.elsewhere(own[0], str(older))[1:] == [
        f"  bbbbbbbbbbbb  SLURM_CONF={newest}",
        f"  aaaaaaaaaaaa  SLURM_CONF={older} (your shell's SLURM_CONF)",
        'use one with: eval "$(kit cluster env --id ID)"',
    ]
    monkeypatch.setenv("KIT_HOME", str(tmp_path / "own-home"))
    runner = CliRunner()
    shell = runner.invoke(cli, ["cluster", "env"], env={"SLURM_CONF": str(older)})
    assert shell.exit_code == 0 and f"export SLURM_CONF={older}" in shell.stdout, shell.output
    chosen = runner.invoke(cli, ["cluster", "env", "--id", "bbbbbbbbbbbb"], env={"SLURM_CONF": str(older)})
    assert chosen.exit_code == 0 and f"export SLURM_CONF={newest}" in chosen.stdout, chosen.output


def test_prometheus_reads_a_pattern_per_users_directory_and_its_owner_from_the_path(tmp_path):
    """Prometheus's file_sd takes a glob in a pattern's last part only ('targets/*/*.json' is refused at load), so
    regen writes a pattern per user directory (root made them: the Prolog) into prometheus.yml, which promtool
    accepts; a name that is no user's (a dot file, a symlink, a plain file) is not one."""
    from kit.cluster import prometheus

    require("promtool")
    d, targets = tmp_path / "prom", tmp_path / "public" / config.TARGETS
    d.mkdir()
    for name in ("root", "alice", "b.o-b"):
        (targets / name).mkdir(parents=True)
    (targets / ".alice.Xy12ab").mkdir()  # the Prolog's, not yet handed over
    (targets / "loose.json").write_text("[]")
    (targets / "link").symlink_to(tmp_path)
    (d / "prometheus.yml.in").write_text(
        f"scrape_configs:\n  - job_name: kit\n    file_sd_configs:\n      - files:\n        {prometheus.FILES_MARK}\n"
    )
    (d / "regen").write_text(prometheus.regen_script(d, targets))
    (d / "regen").chmod(0o700)
    lint = subprocess.run(["shellcheck", "--severity=style", str(d / "regen")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    assert subprocess.run([str(d / "regen")]).returncode == 0
    written = (d / "prometheus.yml").read_text()
    patterns = sorted(line.strip() for line in written.splitlines() if line.strip().startswith("- '"))
    assert patterns == [f"- '{targets}/{n}/*.json'" for n in ("alice", "b.o-b", "root")], written
    checked = subprocess.run(["promtool", "check", "config", str(d / "prometheus.yml")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
