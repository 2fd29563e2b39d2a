"""The files `kit cluster up` writes, rendered from the cluster's shape alone
(pure functions: golden files pin them without Slurm, pyxis or enroot here).

- ``slurm.conf``: several ``slurmd -N nodeK`` on one host, Slurm's defaults
  where they matter to behaviour (``KillWait`` 30 s: pyxis's ``enroot remove``
  needs seconds).
- ``plugstack.conf``: real pyxis (with a ``runtime_path`` of this cluster's
  own) or kit's stand-in.
- per-node ``enroot`` wrappers (real pyxis only): every slurmd of this host
  would otherwise share one enroot data path, and two nodes of a job collide
  on pyxis's ``pyxis_<job>.<step>`` container. pyxis clears the environment of
  the enroot commands it runs except ``PATH``, so each slurmd gets its own
  wrapper first on its ``PATH``, setting that node's ``ENROOT_*_PATH``: the
  job's user's own directories on that node, which the ``prolog`` makes (as a
  site's enroot.conf names ``user-$(id -u)`` directories, made here by root in a
  directory only root writes, so that no user makes another's first).
"""

from __future__ import annotations

import socket
from pathlib import Path

from kit.cluster import accounting, network
from kit.core.bash import quote
from kit.errors import KitError

PARTITION = "local"
PYXIS, STAND_IN = "pyxis", "kit-pyxis"


def choose_containers(pyxis: str | None, enroot: str | None, can_build_stand_in: bool) -> str | None:
    """Which container plugin the cluster runs: real pyxis when both it and
    enroot are installed, else kit's stand-in when it can be built, else none."""
    if pyxis and enroot:
        return PYXIS
    return STAND_IN if can_build_stand_in else None


def munge_socket(public: Path) -> Path:
    """The socket of the cluster's own munged (``auth/munge``), in the directory its clients read."""
    return public / "munge" / "munge.socket"


def munged_argv(root: Path, public: Path) -> list[str]:
    """The cluster's own munged: its key, pid, log and seed under the cluster's (private) directory, its
    socket where every client reaches it."""
    m = root / "munge"
    return [
        "munged",
        "--force",
        f"--key-file={m}/munge.key",
        f"--socket={munge_socket(public)}",
        f"--pid-file={root}/run/munged.pid",
        f"--log-file={root}/log/munged.log",
        f"--seed-file={m}/munged.seed",
    ]


def bound_to(address: str, argv: list[str]) -> list[str]:
    """``argv`` in a UTS namespace of its own whose host name is ``address``. With ``NoCtldInAddrAny`` /
    ``NoInAddrAny`` a Slurm 22.05 daemon binds the address its host name resolves to (``slurm_setup_addr``),
    never ``SlurmctldHost``'s or ``DbdAddr``'s (measured); a dotted quad resolves to itself, and
    slurmctld takes a ``SlurmctldHost`` of ``localhost`` as its own whatever the host name."""
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', address, *argv]


def loopback_host(hostname: str) -> bool:
    """Whether ``hostname`` resolves to 127.0.0.1 alone, the nodes' NodeAddr: with ``NoInAddrAny`` a slurmd
    binds what the host name resolves to, so Debian's 127.0.1.1 would leave slurmctld no slurmd to reach."""
    try:
        infos = socket.getaddrinfo(hostname, None, socket.AF_INET)
    except OSError:
        return False
    return bool(infos) and {i[4][0] for i in infos} == {"127.0.0.1"}


def choose_auth(st, munged: bool, progress) -> None:
    """``st.auth`` and ``st.nodes_bound``. slurmctld and slurmdbd always bind their one address; the
    slurmds (and Slurm's clients, which share the switch) bind the host name's address when that is
    loopback on a shared network; in an isolated network each slurmd is alone in its namespace.
    ``auth/none`` trusts whatever uid a client claims: only where every port is loopback's."""
    st.nodes_bound = not getattr(st, "network", None) and loopback_host(st.hostname)
    st.auth = "munge" if munged else "none"
    if st.auth == "none" and not st.nodes_bound:
        where = (
            "in an isolated network"
            if getattr(st, "network", None)
            else f"where this host's name ({st.hostname}) resolves, not loopback"
        )
        raise KitError(
            f"munged not found, and the nodes would listen {where}: any peer could claim to be root",
            field="cluster",
            hint="install munge (apt-get install -y munge): the cluster then starts its own munged",
        )
    if st.auth == "none":
        progress(
            "munged not found: the cluster trusts the uid every local client claims "
            "(install munge to let only real uids through)"
        )


def auth_lines(st, public: Path) -> list[str]:
    """How every daemon and client authenticates (slurm.conf and slurmdbd.conf alike)."""
    if getattr(st, "auth", "none") == "munge":
        return ["AuthType=auth/munge", f"AuthInfo=socket={munge_socket(public)}"]
    return ["AuthType=auth/none"]


def slurm_conf(st, root: Path, user: str, first_job_id: int, public: Path | None = None) -> str:
    """``st``: the cluster's shape and ports (a :class:`kit.cluster.ClusterState`); ``root`` its directory
    (state, logs: the owner's alone); ``public`` where its clients read (slurm.conf's own directory: the
    plugin stack, munged's socket; default ``root``).

    ``st.auth`` ``munge``: every request is authenticated by the cluster's own munged
    (a client's uid is the kernel's word, not the client's); ``none`` (no munged on this
    machine) trusts whatever uid a client claims, so any local user could act as root."""
    r, public = root, public or root
    net = getattr(st, "network", None)  # --isolated-network: each node at its own address
    munge = getattr(st, "auth", "none") == "munge"
    auth = [*auth_lines(st, public), "CredType=cred/munge" if munge else "CredType=cred/none"]
    lines = [
        "# Written by `kit cluster up`: a Slurm cluster of several slurmd on one host.",
        "ClusterName=kit",
        f"SlurmctldHost=localhost({network.host_address(st)})",  # slurmctld runs bound_to that address
        f"SlurmctldPort={st.ctld_port}",
        # Never every address of the machine (Slurm's default): see bound_to and choose_auth.
        "CommunicationParameters=NoCtldInAddrAny" + (",NoInAddrAny" if getattr(st, "nodes_bound", False) else ""),
        *auth,
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        f"StateSaveLocation={r}/state",
        f"SlurmdSpoolDir={public}/spool/%n",  # the job's user runs its batch script from there
        f"SlurmctldPidFile={r}/run/slurmctld.pid",
        f"SlurmdPidFile={r}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={r}/log/slurmctld.log",
        f"SlurmdLogFile={r}/log/slurmd-%n.log",
        f"PlugStackConfig={public}/plugstack.conf",
        f"Prolog={public}/prolog",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        *accounting.storage_lines(st, munge_socket(public) if munge else None),
        # KillWait stays Slurm's default (30 s), as on sites: cleanup that
        # needs more than a few seconds (pyxis's enroot remove, checkpoints) gets it here too.
        "MinJobAge=300",
        "InactiveLimit=0",
        "SlurmdTimeout=60",
        "GresTypes=gpu",
        f"FirstJobId={first_job_id}",
    ]
    gres = f" Gres=gpu:{st.gpus_per_node}" if st.gpus_per_node else ""
    for i, port in enumerate(st.node_ports, 1):
        addr = net["addresses"][f"node{i}"] if net else "127.0.0.1"
        lines.append(
            f"NodeName=node{i} NodeHostname={st.hostname} NodeAddr={addr} Port={port} "
            f"CPUs={st.cpus_per_node} RealMemory={st.memory_mb}{gres} State=UNKNOWN"
        )
    lines.append(f"PartitionName={PARTITION} Nodes=node[1-{st.nodes}] Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def pyxis_runtime(public: Path) -> Path:
    """pyxis's own runtime directory, one per cluster (plugstack ``runtime_path=``), where the job's
    user reaches it (the cluster's public directory)."""
    return public / "enroot" / "pyxis"


def plugstack_conf(
    containers: str | None,
    root: Path,
    plugin: str | None,
    squashfuse: bool = False,
    scope: str = "global",
    public: Path | None = None,
) -> str:
    """The plugin line; ``squashfuse``: pyxis's ``use_squashfuse=1``; ``scope``: its ``container_scope``
    (job: named containers are the job's, removed by the job epilog) — the stand-in takes both, and finds
    the nodes' data directories in its epilog through ``kit_data=``. Read by each new step's slurmstepd."""
    lines = ["# SPANK plugins of kit's local cluster"]
    mode = (" use_squashfuse=1" if squashfuse else "") + (" container_scope=job" if scope == "job" else "")
    if containers == PYXIS:
        lines.append(f"required {plugin} runtime_path={pyxis_runtime(public or root)}{mode}")
    elif containers == STAND_IN:
        lines.append(f"required {plugin}{mode}" + (f" kit_data={root / 'enroot'}" if scope == "job" else ""))
    return "\n".join(lines) + "\n"


def gres_conf(st, root: Path) -> str:
    """Slurm 22.05 drops GPUs without File=: each node's device files (:func:`gpu_files`,
    character devices with /dev/null's numbers, so that Slurm binds them: CUDA_VISIBLE_DEVICES
    and SLURM_STEP_GPUS per step; TaskPlugin=task/none constrains no device)."""
    lines = ["# GPUs of kit's local cluster: bound by Slurm, no hardware behind them"]
    if st.gpus_per_node:
        for i in range(1, st.nodes + 1):
            dev = root / "dev" / f"node{i}"
            files = f"{dev}/gpu[0-{st.gpus_per_node - 1}]" if st.gpus_per_node > 1 else f"{dev}/gpu0"
            lines.append(f"NodeName=node{i} Name=gpu File={files}")
    return "\n".join(lines) + "\n"


def gpu_files(st, root: Path) -> list[Path]:
    return [root / "dev" / f"node{i}" / f"gpu{g}" for i in range(1, st.nodes + 1) for g in range(st.gpus_per_node)]


def stand_in_data(root: Path, node: str) -> Path:
    """Where the stand-in's slurmstepd (root) keeps ``node``'s named containers."""
    return root / "enroot" / node / "data"


ENROOT_DIRS = {"ENROOT_CACHE_PATH": "cache", "ENROOT_DATA_PATH": "data", "ENROOT_RUNTIME_PATH": "runtime"}


def enroot_node(public: Path, node: str) -> Path:
    """Real pyxis: ``node``'s enroot directory (root's, 0755), where every user reads: its wrapper in
    ``bin``, each job user's directories in ``user-UID`` (theirs, 0700, made by the :func:`prolog`)."""
    return public / "enroot" / node


def enroot_bin(public: Path, node: str) -> Path:
    """The directory put first on ``node``'s slurmd PATH (it holds the wrapper)."""
    return enroot_node(public, node) / "bin"


def enroot_wrapper(public: Path, node: str, enroot: str) -> str:
    """The ``enroot`` that ``node``'s pyxis runs: the real one, with the node's paths of the user it
    runs as, and enroot's own directory on ``PATH`` (its helpers, ``enroot-nsenter`` and the others,
    are found through it: a slurmd restarted from a shell without it still runs containers)."""
    exports = "\n".join(f'export {name}="${{base}}/{sub}"' for name, sub in ENROOT_DIRS.items())
    return (
        f"#!/usr/bin/env bash\n"
        f"# Written by `kit cluster up`: enroot for {node} of kit's local cluster, whose slurmd\n"
        f"# has this directory first on its PATH; the directories are the user's own (the prolog's).\n"
        f"set -euo pipefail\n"
        f'base={quote(str(enroot_node(public, node)))}/user-"${{UID}}"\n'
        f"{exports}\n"
        f'export PATH={quote(str(Path(enroot).parent))}:"${{PATH}}"\n'
        f'exec {quote(enroot)} "$@"\n'
    )


def named_containers(root: Path, public: Path, containers: str | None, node: str, uid: int) -> Path:
    """Where ``node`` keeps user ``uid``'s named containers (``pyxis_NAME``): their own enroot data path
    under real pyxis, the stand-in's data directory's ``user-UID`` (a name is its user's alone)."""
    if containers == PYXIS:
        return enroot_node(public, node) / f"user-{uid}" / ENROOT_DIRS["ENROOT_DATA_PATH"]
    return stand_in_data(root, node) / f"user-{uid}"


TARGETS = "prometheus-targets"  # in the public directory: Prometheus's file_sd, a directory per user


def prolog(public: Path, enroot: bool, regen: Path) -> str:
    """Slurm's ``Prolog`` (root, on each node before the job's first step there): the job's user's own directories,
    each made in a directory only root writes and then handed over whole (under a temporary name: a second job of
    theirs starting beside it finds one or the other; a failed prolog would drain the node, so it never fails):
    their Prometheus targets directory (0755: Prometheus reads it, it labels their targets ``owner``) when the
    cluster runs Prometheus — a new one is added to Prometheus's file_sd (``regen``: its patterns take a glob in
    their last part only) —, and under real pyxis their enroot directory on that node (0700)."""
    return (
        "#!/usr/bin/env bash\n"
        "# Written by `kit cluster up`: the job's user's own directories (theirs), made as root before its first step.\n"
        "set -uo pipefail\n"
        '[[ "${SLURM_JOB_UID:-}" =~ ^[0-9]+$ ]] || exit 0\n'
        'gid="${SLURM_JOB_GID:-$(id -g "${SLURM_JOB_UID}")}"\n'
        "own() {  # DIR NAME MODE: DIR/NAME, the job user's, where DIR exists and it does not\n"
        "  local new\n"
        '  [[ -d "$1" && ! -e "$1/$2" ]] || return 0\n'
        '  new=$(mktemp -d "$1/.$2.XXXXXX") || return 0\n'
        '  chmod "$3" "${new}"\n'
        '  if (( EUID == 0 )); then chown "${SLURM_JOB_UID}:${gid}" "${new}"; fi\n'
        '  mv -T "${new}" "$1/$2" 2>/dev/null || rmdir "${new}"\n'
        "}\n"
        'user="${SLURM_JOB_USER:-$(id -nu "${SLURM_JOB_UID}")}"\n'
        f"targets={quote(str(public / TARGETS))}\n"
        'if [[ "${user}" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ && -d "${targets}" && ! -e "${targets}/${user}" ]]; then\n'
        '  own "${targets}" "${user}" 0755\n'
        f"  if [[ -x {quote(str(regen))} ]]; then {quote(str(regen))} || true; fi\n"
        "fi\n"
        + (
            'if [[ "${SLURMD_NODENAME:-}" =~ ^[A-Za-z0-9_-]+$ ]]; then\n'
            f'  own {quote(str(public / "enroot"))}/"${{SLURMD_NODENAME}}" "user-${{SLURM_JOB_UID}}" 0700\n'
            "fi\n"
            if enroot
            else ""
        )
        + "exit 0\n"
    )


def daemon_env(root: Path, conf: Path, name: str, containers: str | None, path: str) -> dict[str, str]:
    """The environment a daemon starts with: its slurm.conf; for slurmdbd, the accounting
    database's socket; for a slurmd, where its node keeps containers: under real pyxis its
    node's enroot wrapper first on ``PATH``; under the stand-in ``KIT_PYXIS_DATA`` (its
    slurmstepd reads it), the same directory as enroot's data path."""
    env = {"SLURM_CONF": str(conf)}
    node = name.startswith("node")
    if name == "slurmdbd":
        env["MYSQL_UNIX_PORT"] = str(accounting.db_socket(root))
    elif node and containers == PYXIS:
        env["PATH"] = f"{enroot_bin(conf.parent, name)}:{path}"
    elif node and containers == STAND_IN:
        env["KIT_PYXIS_DATA"] = str(stand_in_data(root, name))
    return env
