/*
 * slurmstepd.c: AS ROOT, in slurmstepd before the tasks start and after they end: the step's mount namespace and
 * the container made in it, the job epilog. Everything it does with what the user named goes through image.c,
 * mounts.c and rootfs.c.
 */
#include "kit_pyxis.h"

char root[256];
char workdir[4096];
int ready, reused, direct;

/* The image's root on ROOT: a named container's kept directory, or an overlay over the
 * squashfs, mounted through a loop device or (direct) through squashfuse — as enroot does
 * with its default ENROOT_NATIVE_OVERLAYFS (a kernel overlay, no fuse-overlayfs). */
int mount_image(const char *base)
{
	char dir[4096], upper[256], work[256], image_dir[256], opts[1024];
	if (opt_name && *opt_name) {
		if (!valid_name(opt_name))  /* enroot: "Invalid argument"; the name is a file name, never a path */
			return fail("pyxis: --container-name: invalid container name: %s (letters, digits, '.', '_' and '-' "
				    "only): Invalid argument", opt_name);
		/* pyxis_NAME in the job's user's data directory on the node, kept after the job: a name is its
		 * user's alone, as with enroot's per-user data path (another user's same name is another container). */
		const char *node_data = getenv("KIT_PYXIS_DATA");
		char data[4096];
		if (!node_data || !*node_data)
			return fail(TAG ": --container-name: KIT_PYXIS_DATA is not set for this slurmd (kit cluster up sets it)");
		snprintf(data, sizeof(data), "%s/user-%u", node_data, (unsigned)job_uid);
		int n = job_scope ?  /* pyxis's name for it; the job epilog removes it */
			snprintf(dir, sizeof(dir) - 8, "%s/pyxis_%u_%s", data, (unsigned)job_id, opt_name) :
			snprintf(dir, sizeof(dir) - 8, "%s/pyxis_%s", data, opt_name);
		if (n < 0 || (size_t)n >= sizeof(dir) - 8)  /* room for unpack's ".new" */
			return fail("pyxis: --container-name: name too long: %s", opt_name);
		if (access(dir, F_OK) == 0) {
			reused = 1;
		} else if (!opt_image) {
			return fail("pyxis: error: no container named %s on this node, and --container-image is not set", opt_name);
		} else if (mkdir_p(data, 0700) < 0 || unpack(dir) < 0) {
			return fail(TAG ": --container-image: cannot unpack %s into %s", opt_image, dir);
		}
		/* nosuid, nodev: a container unpacked before this rule (as root) may hold set-id files of root's */
		if (mount(dir, root, NULL, MS_BIND | MS_REC, NULL) < 0 ||
		    mount(NULL, root, NULL, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | kept_flags(root), NULL) < 0)
			return fail(TAG ": bind %s: %m", dir);
		return 0;
	}
	int user = direct && geteuid() != 0;
	snprintf(image_dir, sizeof(image_dir), "%s/image", base);
	/* An ordinary user's overlay layers on a tmpfs of their namespace's own (the step's is root's). */
	snprintf(dir, sizeof(dir), "%s/rw", base);
	if (user && (mkdir_p(dir, 0700) < 0 || mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700") < 0))
		return fail(TAG ": tmpfs for the container's writable layer: %m");
	snprintf(upper, sizeof(upper), "%s%s/upper", base, user ? "/rw" : "");
	snprintf(work, sizeof(work), "%s%s/work", base, user ? "/rw" : "");
	mkdir_p(image_dir, 0755);
	mkdir_p(upper, 0755);
	mkdir_p(work, 0755);
	if (user)
		make_targets_in(upper);
	if (direct) {
		if (mount_squashfuse(image_dir) < 0)
			return -1;
	} else if (mount_squashfs(image_dir) < 0) {
		return -1;
	}
	snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s", image_dir, upper, work);
	if (direct)
		return mount_overlay(opts);
	if (mount("overlay", root, "overlay", MS_NOSUID | MS_NODEV, opts) < 0)
		return fail(TAG ": overlay on %s: %m", root);
	return 0;
}

/* What pyxis puts in the container once its root is there: /proc, /dev, /sys, /tmp, /run,
 * the host's files, the home directory, the user's mounts, the batch script; read-only. */
int finish_container(spank_t sp)
{
	/* a user namespace owns no pid namespace to mount a proc of: the host's, bound */
	if (geteuid() != 0 ? bind_mount(root, "/proc", "/proc", 0) < 0 :
	    mount_in(root, "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		return -1;
	if (bind_mount(root, "/dev", "/dev", 0) < 0 || bind_mount(root, "/sys", "/sys", MS_RDONLY) < 0)
		return -1;
	/* As enroot 4.1.2: /tmp a tmpfs of mode 0755 owned by the task's user (not 1777): the job's user, not
	 * slurmstepd's root that makes it (an ordinary user's task could not write its own /tmp). */
	char tmpfs_opts[64];
	uid_t uid = getuid();
	gid_t gid = getgid();
	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS || spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS)
		uid = getuid(), gid = getgid();
	snprintf(tmpfs_opts, sizeof(tmpfs_opts), "mode=0755,uid=%u,gid=%u", (unsigned)uid, (unsigned)gid);
	for (const char **t = (const char *[]){ "/tmp", "/run", NULL }; *t; t++)
		if (mount_in(root, *t, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs_opts) < 0)
			return -1;
	for (const char *const *f = HOST_FILES; *f; f++)
		if (access(*f, R_OK) == 0)
			bind_mount(root, *f, *f, MS_RDONLY);  /* the host's, as pyxis gives them */
	if (opt_mount_home) {
		char home[4096];
		if (spank_getenv(sp, "HOME", home, sizeof(home)) == ESPANK_SUCCESS && bind_mount(root, home, home, 0) < 0)
			return -1;
	}
	if (user_mounts(root) < 0)
		return -1;
	/* The batch step (sbatch --container-image): its script, in slurmd's spool
	 * directory, is bound read-only at the same path, as pyxis does. */
	uint32_t step = 0;
	int argc = 0;
	char **argv = NULL;
	if (spank_get_item(sp, S_JOB_STEPID, &step) == ESPANK_SUCCESS && step == SLURM_BATCH_SCRIPT &&
	    spank_get_item(sp, S_JOB_ARGV, &argc, &argv) == ESPANK_SUCCESS && argc > 0 &&
	    bind_mount(root, argv[0], argv[0], MS_RDONLY | MS_NOSUID | MS_NODEV) < 0)
		return -1;
	if (!opt_writable && mount(NULL, root, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | kept_flags(root), NULL) < 0)
		return fail(TAG ": read-only root: %m");
	return 0;
}

void set_workdir(void)
{
	char user[512] = "", home[512] = "", shell[512] = "";
	image_user(root, job_uid, user, home, shell, sizeof(user));
	if (opt_workdir && *opt_workdir)
		snprintf(workdir, sizeof(workdir), "%s", opt_workdir);
	else
		default_workdir(root, home, workdir, sizeof(workdir));
}

/* The step's mount namespace, made once per node by slurmstepd before its tasks start:
 * they inherit it and share the container. Its root is mounted here too, but under direct
 * squashfuse startup, where the node's first task mounts it (start_direct). */
int make_container(spank_t sp)
{
	const char *base = BASE;
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		return fail(TAG ": cannot make a mount namespace: %m");
	if (mkdir_p(base, 0755) < 0 || mount("tmpfs", base, "tmpfs", 0, "mode=0755") < 0)
		return fail(TAG ": cannot mount a tmpfs on %s: %m", base);
	snprintf(root, sizeof(root), "%s/root", base);
	mkdir_p(root, 0755);
	/* As pyxis: direct startup only for a temporary container from a squashfs path. */
	direct = use_squashfuse && !(opt_name && *opt_name) && opt_image && strspn(opt_image, "./") > 0;
	if (direct) {
		slurm_info("pyxis: skipping container creation (squashfuse enabled)");  /* pyxis's words */
		uid_t uid = 0;
		gid_t gid = 0;
		struct stat fuse;
		if (spank_get_item(sp, S_JOB_UID, &uid) == ESPANK_SUCCESS && uid != 0 &&
		    spank_get_item(sp, S_JOB_GID, &gid) == ESPANK_SUCCESS &&
		    (mkdir(USER_BASE, 0700) < 0 || chown(USER_BASE, uid, gid) < 0 || stat("/dev/fuse", &fuse) < 0 ||
		     mknod(USER_BASE "/fuse", S_IFCHR | 0600, fuse.st_rdev) < 0 || chown(USER_BASE "/fuse", uid, gid) < 0))
			return fail(TAG ": cannot make %s and its FUSE device for uid %u: %m", USER_BASE, (unsigned)uid);
		return 0;
	}
	if (mount_image(base) < 0 || add_job_user(root) < 0 || finish_container(sp) < 0)
		return -1;
	set_workdir();
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac; (void)av;
	if (spank_context() != S_CTX_REMOTE || (!opt_image && !opt_name))
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS)
		job_id = 0;
	if (spank_get_item(sp, S_JOB_UID, &job_uid) != ESPANK_SUCCESS)
		job_uid = getuid();
	if (spank_get_item(sp, S_JOB_GID, &job_gid) != ESPANK_SUCCESS)
		job_gid = getgid();
	if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &job_gids, &job_ngids) != ESPANK_SUCCESS)
		job_gids = NULL, job_ngids = 0;
	ready = make_container(sp) == 0;
	return 0;
}

/* The step is over: take the container down now (the namespace would go with
 * slurmstepd a moment later), so its loop device is free when srun returns. */
int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void)ac; (void)av;
	if (spank_context() != S_CTX_REMOTE || !ready)
		return 0;
	umount2(root, MNT_DETACH);
	umount2(BASE "/image", MNT_DETACH);
	uid_t uid = 0;
	if (direct) {
		stop_fuse_daemons(BASE "/fuse.pids", 0);
		if (spank_get_item(sp, S_JOB_UID, &uid) == ESPANK_SUCCESS && uid != 0)
			stop_fuse_daemons(USER_BASE "/fuse.pids", uid);
	}
	umount2(BASE, MNT_DETACH);
	return 0;
}

/* container_scope=job (as pyxis's slurm_spank_job_epilog): the job's named containers
 * (pyxis_JOBID_NAME in the node's data directory) are removed once the job has ended on
 * the node, out of its steps. A failure is an error, which drains the node, as pyxis's. */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	uint32_t id;
	uid_t uid;
	char data[4096], prefix[64], path[4096 + 256];
	if (parse_config(ac, av) < 0)
		return -1;
	if (!job_scope || !kit_data)
		return 0;
	const char *node = getenv("SLURMD_NODENAME");
	if (spank_get_item(sp, S_JOB_ID, &id) != ESPANK_SUCCESS || spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    !node || !*node || strchr(node, '/') || node[0] == '.') {
		slurm_error(TAG ": epilog: no job id, user or node name");
		return -1;
	}
	snprintf(data, sizeof(data), "%s/%s/data/user-%u", kit_data, node, (unsigned)uid);
	snprintf(prefix, sizeof(prefix), "pyxis_%u_", (unsigned)id);
	DIR *d = opendir(data);
	if (!d)
		return errno == ENOENT ? 0 : (slurm_error(TAG ": epilog: %s: %m", data), -1);
	int rc = 0;
	for (struct dirent *e; (e = readdir(d));) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", data, e->d_name);
		/* rm follows no symbolic link and, here, crosses into no other file system */
		pid_t pid = fork();
		if (pid == 0) {
			execl("/bin/rm", "rm", "-rf", "--one-file-system", "--", path, (char *)NULL);
			_exit(127);
		}
		int status = 0;
		if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			slurm_error(TAG ": epilog: couldn't remove %s", path);
			rc = -1;
		}
	}
	closedir(d);
	return rc;
}
