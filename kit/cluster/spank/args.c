/*
 * kit_pyxis: a small pyxis-compatible SPANK plugin for kit's local cluster.
 *
 * It accepts pyxis' --container-* options with pyxis' syntax and follows
 * pyxis where kit relies on it (containers/README.md has the conformance
 * table, each row with its test): one container per node per step, set up
 * by slurmstepd before the tasks start and shared by that node's tasks; the
 * squashfs image (read-only, writable with --container-writable) with /proc,
 * /sys (read-only), /dev, /tmp, /run, the host's /etc/hosts, /etc/hostname,
 * /etc/resolv.conf and /etc/machine-id, and the --container-mounts binds and their flags;
 * --container-name keeps the container's root filesystem in the node's data
 * directory (KIT_PYXIS_DATA, set by `kit cluster up`) for later jobs (with
 * container_scope=job, as pyxis: for the job's later steps, removed by the job
 * epilog, which finds the directory through kit_data=); the
 * task loses LANG, LANGUAGE and LC_ALL, and the login variables and the
 * image's /etc/environment override the task's except those named in
 * --container-env; errors in pyxis' words.
 *
 * With use_squashfuse=1 on its plugstack.conf line (as pyxis), a container
 * without --container-name is started from the squashfs file through FUSE,
 * as enroot does then: the node's first task runs `squashfuse` (the overlay's
 * lower layer; with native_overlayfs=0 also `fuse-overlayfs`, the root) below
 * itself, and they must live as long as the step (a teardown that stops them takes
 * the image away under the tasks; so does the step's own signal, which
 * reaches them as every process of the step).
 *
 * The container lives in a mount namespace of the step's slurmstepd: when
 * the step ends, nothing is left mounted. A root task runs in it as root; an
 * ordinary user's task enters it through a user namespace of its own that maps
 * the user to themselves (enroot's way for unprivileged users: no chroot with
 * privileges the user does not have). No seccomp filter: a stand-in for machines
 * without pyxis and enroot; nothing kit generates depends on it.
 *
 * One file per context, as pyxis keeps them (pyxis_srun.c, pyxis_slurmstepd.c, args.c, enroot.c), so a reader
 * sees at once what runs as root and what as the job's user:
 *   args.c        every context: the options and the plugstack.conf line, parsed (nothing done)
 *   slurmstepd.c  AS ROOT, before the tasks and after them: the step's mount namespace, the container, the epilog
 *   task.c        AS THE JOB'S USER, in each task: the environment, its user namespace, the chroot
 *   image.c       the user's image file: a copy root alone can change, listed and unpacked as the user
 *   mounts.c      what is mounted into the container, each destination resolved inside its root
 *   rootfs.c      files inside the container's root, read and written only through it
 *   fuse.c        squashfuse mode's daemons
 *   common.c      the first failure; paths inside a root; the user's credentials for what they name
 * Root never resolves a path, runs a parser on bytes, or writes a file that the user chose except through
 * image.c's copy, mounts.c's and rootfs.c's resolution inside the container, and common.c's open_as_user/run_as.
 *
 * Built by `kit cluster up` against Debian's libslurm-dev headers (all the .c files, one shared object; only
 * the SPANK entry points are exported: kit_pyxis.h hides the rest).
 */
/*
 * args.c: pyxis's options and the plugstack.conf line, in every context (srun, sbatch, salloc, slurmstepd): what
 * the user asked for, parsed, nothing done.
 */
#include "kit_pyxis.h"

SPANK_PLUGIN(kit_pyxis, 1);

char *opt_image, *opt_mounts, *opt_workdir, *opt_env, *opt_name;
int opt_writable, opt_mount_home, opt_remap_root;
int use_squashfuse;
int native_overlayfs = 1;
int job_scope;
char *kit_data;

static int set_str(char **dst, const char *val)
{
	free(*dst);
	*dst = val ? strdup(val) : NULL;
	return 0;
}

static int cb_image(int v, const char *a, int r) { (void)v; (void)r; return set_str(&opt_image, a); }
static int cb_mounts(int v, const char *a, int r) { (void)v; (void)r; return set_str(&opt_mounts, a); }
static int cb_workdir(int v, const char *a, int r) { (void)v; (void)r; return set_str(&opt_workdir, a); }
static int cb_env(int v, const char *a, int r) { (void)v; (void)r; return set_str(&opt_env, a); }
static int cb_name(int v, const char *a, int r) { (void)v; (void)r; return set_str(&opt_name, a); }
static int cb_flag(int v, const char *a, int r)
{
	(void)a; (void)r;
	switch (v) {
	case 1: opt_writable = 1; break;
	case 2: opt_writable = 0; break;
	case 3: opt_mount_home = 1; break;
	case 4: opt_mount_home = 0; break;
	case 5: opt_remap_root = 1; break;
	case 6: opt_remap_root = 0; break;
	}
	return 0;
}

/* Registered in every context (slurm_spank_init below): a spank_options table
 * would not reach sbatch and salloc, which take pyxis's flags too (the batch
 * script then runs in the container; salloc's steps inherit them). */
static struct spank_option options[] = {
	{ "container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH", "[kit-pyxis] squashfs image to run the task in", 1, 0, cb_image },
	{ "container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]", "[kit-pyxis] bind mounts, comma separated", 1, 0, cb_mounts },
	{ "container-workdir", "PATH", "[kit-pyxis] working directory inside the container (must exist)", 1, 0, cb_workdir },
	{ "container-env", "NAME[,NAME...]", "[kit-pyxis] variables whose task values win over the image's", 1, 0, cb_env },
	{ "container-name", "NAME", "[kit-pyxis] keep the container on the node under NAME; reuse it if it exists", 1, 0, cb_name },
	{ "container-writable", NULL, "[kit-pyxis] make the root filesystem writable", 0, 1, cb_flag },
	{ "container-readonly", NULL, "[kit-pyxis] read-only root filesystem (default)", 0, 2, cb_flag },
	{ "container-mount-home", NULL, "[kit-pyxis] bind the user's home directory", 0, 3, cb_flag },
	{ "no-container-mount-home", NULL, "[kit-pyxis] do not bind the home directory (default)", 0, 4, cb_flag },
	{ "container-remap-root", NULL, "[kit-pyxis] accepted; tasks already run as root here", 0, 5, cb_flag },
	{ "no-container-remap-root", NULL, "[kit-pyxis] accepted", 0, 6, cb_flag },
	SPANK_OPTIONS_TABLE_END
};

/* pyxis's boolean words for a plugstack.conf setting (-1: none of them). */
static int parse_bool(const char *v)
{
	for (const char **t = (const char *[]){ "1", "true", "yes", "y", "on", NULL }; *t; t++)
		if (strcasecmp(v, *t) == 0)
			return 1;
	for (const char **f = (const char *[]){ "0", "false", "no", "n", "off", NULL }; *f; f++)
		if (strcasecmp(v, *f) == 0)
			return 0;
	return -1;
}

/* The plugstack.conf line's settings (pyxis's use_squashfuse and container_scope; kit_data). */
int parse_config(int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "use_squashfuse=", 15) == 0 && (use_squashfuse = parse_bool(av[i] + 15)) >= 0)
			continue;
		if (strcmp(av[i], "container_scope=job") == 0 || strcmp(av[i], "container_scope=global") == 0) {
			job_scope = strcmp(av[i] + 16, "job") == 0;
			continue;
		}
		if (strncmp(av[i], "native_overlayfs=", 17) == 0 && (native_overlayfs = parse_bool(av[i] + 17)) >= 0)
			continue;
		if (strncmp(av[i], "kit_data=/", 10) == 0) {
			kit_data = av[i] + 9;
			continue;
		}
		slurm_error(TAG ": plugstack.conf: unknown or invalid setting: %s", av[i]);
		return -1;
	}
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	if (parse_config(ac, av) < 0)
		return -1;
	for (struct spank_option *o = options; o->name; o++)
		if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
			slurm_error(TAG ": cannot register --%s", o->name);
			return -1;
		}
	return 0;
}

int kept(const char *name)
{
	if (!opt_env)
		return 0;
	size_t n = strlen(name);
	for (const char *p = opt_env; *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len == n && strncmp(p, name, n) == 0)
			return 1;
		if (!end)
			break;
		p = end + 1;
	}
	return 0;
}
