/*
 * fuse.c: squashfuse mode's FUSE daemons: started below the node's first task (root's) or in the user's namespaces
 * (theirs), recorded, stopped with the step.
 */
#include "kit_pyxis.h"

/* Fork ARGV as a daemon below the calling process (as enroot's live below pyxis's first task): no input or
 * output, a session of its own, and KEEP (when >= 0) as its descriptor 3. */
static pid_t spawn_daemon(char *const argv[], int keep)
{
	pid_t pid = fork();
	if (pid == 0) {
		if (keep >= 0)
			dup2(keep, 3);
		int null = open("/dev/null", O_RDWR);
		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
			dup2(null, 2);
		}
		closefrom(keep >= 0 ? 4 : 3);
		setsid();
		execvp(argv[0], argv);
		_exit(127);
	}
	return pid;
}

/* Start PROG's FUSE daemon (in the foreground, so it lives as long as the mount) below the
 * calling process, and wait until DIR is mounted. SRC NULL: PROG takes the mount point alone
 * (fuse-overlayfs). */
static pid_t fuse_daemon(const char *prog, const char *opts, const char *src, const char *dir)
{
	struct stat before, now;
	if (stat(dir, &before) < 0)
		return -1;
	char *const with_src[] = { (char *)prog, "-f", "-o", (char *)opts, (char *)src, (char *)dir, NULL };
	char *const without[] = { (char *)prog, "-f", "-o", (char *)opts, (char *)dir, NULL };
	pid_t pid = spawn_daemon(src ? with_src : without, -1);
	if (pid < 0)
		return -1;
	for (int i = 0; i < 1000; i++) {  /* 10 s */
		if (stat(dir, &now) == 0 && now.st_dev != before.st_dev)
			return pid;
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return -1;
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

const char *fuse_pids = BASE "/fuse.pids";  /* USER_BASE's for an ordinary user's container */
pid_t squashfuse_pid;  /* the first daemon recorded: whose namespaces an ordinary user's later tasks join */

/* Record a FUSE daemon's pid in fuse_pids, for slurm_spank_exit. */
static void record_fuse_daemon(pid_t pid)
{
	if (!squashfuse_pid)
		squashfuse_pid = pid;
	FILE *f = fopen(fuse_pids, "a");
	if (f) {
		fprintf(f, "%d\n", (int)pid);
		fclose(f);
	}
}

/* A FUSE file system (TYPE, mount FLAGS) on DIR for an ordinary user's task, in its user and mount namespaces:
 * the FUSE mount made here (the task holds the capability in them until it execs), through the device node the
 * step made for the job's user (make_container: /dev/fuse may be root's alone, as on machines without udev's
 * 0666 rule), and ARGV serving it through the descriptor (its mount point /dev/fd/3: libfuse's), below the task.
 * Its pid, recorded; -1 when it does not serve. */
static pid_t user_fuse_daemon(const char *dir, const char *type, unsigned long flags, char *const argv[])
{
	char opts[128];
	int fd = open(USER_BASE "/fuse", O_RDWR);
	if (fd < 0)
		return fail(TAG ": cannot open the step's FUSE device %s: %m", USER_BASE "/fuse");
	snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=%u,group_id=%u", fd, (unsigned)geteuid(),
		 (unsigned)getegid());
	if (mount(argv[0], dir, type, flags | MS_NOSUID | MS_NODEV, opts) < 0) {
		close(fd);
		return fail(TAG ": cannot mount FUSE on %s in the container's namespace: %m", dir);
	}
	pid_t pid = spawn_daemon(argv, fd);
	close(fd);
	struct stat st;
	if (pid < 0 || stat(dir, &st) < 0)  /* answered by the daemon once it serves; ENOTCONN when it failed */
		return -1;
	record_fuse_daemon(pid);
	return pid;
}

/* The squashfs through FUSE on DIR for an ordinary user's task: squashfuse, every file the user's (uid=, gid=),
 * as enroot's, so that their writable container is theirs to write. */
static int mount_squashfuse_user(const char *dir)
{
	char owner[64];
	snprintf(owner, sizeof(owner), "uid=%u,gid=%u", (unsigned)geteuid(), (unsigned)getegid());
	char *const argv[] = { "squashfuse", "-f", "-o", owner, opt_image, "/dev/fd/3", NULL };
	if (user_fuse_daemon(dir, "fuse.squashfuse", MS_RDONLY, argv) < 0)
		return fail(TAG ": --container-image: squashfuse cannot serve %s (is squashfuse installed?)", opt_image);
	return 0;
}

/* The squashfs through FUSE on DIR: squashfuse. */
int mount_squashfuse(const char *dir)
{
	if (geteuid() != 0)
		return mount_squashfuse_user(dir);
	pid_t lower = fuse_daemon("squashfuse", "allow_other", opt_image, dir);
	if (lower < 0)
		return fail(TAG ": --container-image: squashfuse cannot mount %s (is squashfuse installed?)", opt_image);
	record_fuse_daemon(lower);
	return 0;
}

/* The container's root over the squashfuse mount, as enroot lays it: a kernel overlay (its default
 * ENROOT_NATIVE_OVERLAYFS: a path whose lower files are gone fails "Stale file handle" once the step's
 * signal has stopped squashfuse), or with native_overlayfs=0 fuse-overlayfs, a second daemon below the
 * task (PYXIS.md): signalled with the step, it takes the root away, and every path through it fails from
 * then on, /dev/null and the job directory's mount points included. */
int mount_overlay(const char *opts)
{
	if (!native_overlayfs) {
		/* fsname: the image, which names the daemon in a process listing as squashfuse's does */
		char fuse_opts[8192];
		int user = geteuid() != 0;
		snprintf(fuse_opts, sizeof(fuse_opts), "%s,%sfsname=%s", opts, user ? "" : "allow_other,", opt_image);
		char *const argv[] = { "fuse-overlayfs", "-f", "-o", fuse_opts, "/dev/fd/3", NULL };
		pid_t upper = user ? user_fuse_daemon(root, "fuse.fuse-overlayfs", 0, argv) :
			fuse_daemon("fuse-overlayfs", fuse_opts, NULL, root);
		if (upper < 0)
			return fail(TAG ": native_overlayfs=0: fuse-overlayfs cannot mount the container's root on %s (is "
				    "fuse-overlayfs installed?)", root);
		if (!user)
			record_fuse_daemon(upper);
		return 0;
	}
	if (mount("overlay", root, "overlay", MS_NOSUID | MS_NODEV, opts) < 0)
		return fail(TAG ": overlay on %s: %m", root);
	return 0;
}

/* Direct startup: the FUSE daemons end with the step (they may have outlived the task
 * that started them, as enroot's do). */
void stop_fuse_daemons(const char *path, uid_t owner)
{
	int pid = 0;
	char proc[64];
	struct stat st;
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	while (fscanf(f, "%d", &pid) == 1) {
		/* A file the job's user could write: only their own processes are signalled from it. */
		snprintf(proc, sizeof(proc), "/proc/%d", pid);
		if (pid > 1 && stat(proc, &st) == 0 && st.st_uid == owner)
			kill(pid, SIGTERM);
	}
	fclose(f);
}
