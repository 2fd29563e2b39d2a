/*
 * task.c: AS THE JOB'S USER, in each task before it execs: the environment, the user namespace a task enters
 * (enroot's unprivileged way), squashfuse mode's setup, the chroot.
 */
#include "kit_pyxis.h"

/*
 * pyxis's environment rules: the task loses LANG, LANGUAGE and LC_ALL; then
 * every variable of the container process wins over the task's value, but for
 * --container-env names: the image's /etc/environment, then the login
 * variables enroot's switchroot sets where that file did not (but PATH, where
 * the image's /etc/profile sets it: the login shell's) (HOME, SHELL,
 * USER, LOGNAME from the image's passwd entry, which add_job_user wrote; PATH
 * from ENV_SUPATH of the image's /etc/login.defs for root, ENV_PATH for an
 * ordinary user, else glibc's defaults), and TERM from
 * enroot's environ.d (its 10-terminal.env is TERM=${TERM}: the task's own
 * value, empty when the task has none).
 */
static void apply_environment(spank_t sp, const char *root)
{
	char line[65536], seen[4096] = ",";
	for (const char **n = (const char *[]){ "LANG", "LANGUAGE", "LC_ALL", NULL }; *n; n++)
		if (!kept(*n))
			spank_unsetenv(sp, *n);
	FILE *f = fopen_in(root, "/etc/environment");
	/* enroot's switchroot runs the image's login shell (ENROOT_LOGIN_SHELL): an /etc/profile that sets PATH
	 * (Debian's, by uid: login.defs's values) has the last word over /etc/environment's. */
	char *profile_path = image_setting(root, "/etc/profile", "PATH", '=');
	while (f && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		char *eq = strchr(line, '=');
		if (!eq || line[0] == '#' || (profile_path && strncmp(line, "PATH=", 5) == 0))
			continue;
		*eq = '\0';
		if (strlen(seen) + strlen(line) + 2 < sizeof(seen)) {
			strcat(seen, line);
			strcat(seen, ",");
		}
		if (!kept(line))
			spank_setenv(sp, line, eq + 1, 1);
	}
	if (f)
		fclose(f);
	free(profile_path);

	char user[512] = "", home[512] = "", shell[512] = "";
	image_user(root, getuid(), user, home, shell, sizeof(user));
	char *supath = image_setting(root, "/etc/login.defs", getuid() == 0 ? "ENV_SUPATH" : "ENV_PATH", ' ');
	const char *login_path = getuid() == 0 ? "/usr/bin:/bin:/usr/sbin:/sbin" : "/usr/bin:/bin";
	if (supath && *supath)
		login_path = strncmp(supath, "PATH=", 5) == 0 ? supath + 5 : supath;
	const char *login[][2] = { { "HOME", home }, { "SHELL", shell }, { "USER", user }, { "LOGNAME", user },
				   { "PATH", login_path } };
	for (size_t i = 0; i < sizeof(login) / sizeof(login[0]); i++) {
		char key[64];
		snprintf(key, sizeof(key), ",%s,", login[i][0]);
		if (login[i][1][0] && !strstr(seen, key) && !kept(login[i][0]))
			spank_setenv(sp, login[i][0], login[i][1], 1);
	}
	char term[256] = "";
	if (!strstr(seen, ",TERM,") && !kept("TERM")) {
		if (spank_getenv(sp, "TERM", term, sizeof(term)) != ESPANK_SUCCESS)
			term[0] = '\0';
		spank_setenv(sp, "TERM", term, 1);
	}
	free(supath);
}

static int enter_user_container(void);
static int join_container(pid_t pid);
static int in_user_namespace;  /* the task is in its container's user namespace already (start_direct) */

/* Direct startup, in each task before it starts: the first task of the node (under a lock in the step's
 * tmpfs) mounts the root, its FUSE daemons below itself; the others wait for it and take its outcome
 * (BASE/setup: "ok PID", PID its squashfuse, or the failure). An ordinary user's tasks do the same in
 * USER_BASE, as enroot does for them: the first makes a user namespace mapping the user to themselves with a
 * mount namespace of its own and mounts the image there; the others join that squashfuse's namespaces. */
int start_direct(spank_t sp)
{
	int user = geteuid() != 0;
	const char *base = user ? USER_BASE : BASE;
	char lock[256], state[256];
	snprintf(lock, sizeof(lock), "%s/setup.lock", base);
	snprintf(state, sizeof(state), "%s/setup", base);
	if (user) {
		snprintf(root, sizeof(root), "%s/root", base);
		fuse_pids = USER_BASE "/fuse.pids";
	}
	int fd = open(lock, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0 || flock(fd, LOCK_EX) < 0)
		return fail(TAG ": container setup lock %s: %m", lock);
	FILE *f = fopen(state, "r");
	if (f) {
		char line[1024] = "";
		int pid = 0;
		if (!fgets(line, sizeof(line), f))
			line[0] = '\0';
		fclose(f);
		line[strcspn(line, "\n")] = '\0';
		if (sscanf(line, "ok %d", &pid) != 1)
			fail("%s", line[0] ? line : TAG ": the container was not set up");
		else if (user)
			join_container(pid);
	} else {
		slurm_info("pyxis: starting container from squashfs: %s", opt_image);  /* pyxis's words */
		int rc = (user && enter_user_container() < 0) || mount_image(base) < 0 || add_job_user(root) < 0 ||
			 finish_container(sp) < 0 ? -1 : 0;
		f = fopen(state, "w");
		if (f) {
			if (rc == 0)
				fprintf(f, "ok %d\n", (int)squashfuse_pid);
			else
				fprintf(f, "%s\n", failure);
			fclose(f);
		}
	}
	close(fd);
	if (failure[0])
		return -1;
	set_workdir();
	return 0;
}

/* A task of an ordinary user enters the image as enroot does for one: slurmstepd has already switched to
 * the user, so the task makes a user namespace of its own mapping the user to themselves (uid and gid as
 * on the host: its processes are the user's there) and chroots with the capability it holds in it (FLAGS:
 * namespaces to unshare with it; none once in the container's). Root's tasks chroot as they are. */
static int enter_as_user(int flags)
{
	uid_t uid = geteuid();
	gid_t gid = getegid();
	char map[64];
	if (uid == 0 || in_user_namespace)
		return 0;
	/* Set-user-id transitions left the task undumpable: its /proc files root's, its maps unwritable. */
	if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) < 0 || unshare(CLONE_NEWUSER | flags) < 0)
		return fail(TAG ": cannot make a user namespace for uid %u: %m", (unsigned)uid);
	snprintf(map, sizeof(map), "%u %u 1\n", (unsigned)uid, (unsigned)uid);
	if (write_proc("/proc/self/uid_map", map) < 0)
		return fail(TAG ": cannot map uid %u into its user namespace: %m", (unsigned)uid);
	snprintf(map, sizeof(map), "%u %u 1\n", (unsigned)gid, (unsigned)gid);
	if (write_proc("/proc/self/setgroups", "deny") < 0 || write_proc("/proc/self/gid_map", map) < 0)
		return fail(TAG ": cannot map gid %u into its user namespace: %m", (unsigned)gid);
	in_user_namespace = 1;
	return 0;
}

/* Join the user and mount namespaces of process PID (the container's squashfuse, the node's first task's). */
static int join_container(pid_t pid)
{
	char path[64];
	int fds[2];
	const char *names[2] = { "user", "mnt" };
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)pid, names[i]);
		if ((fds[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
			fail(TAG ": cannot open the container's %s namespace (%s): %m", names[i], path);
			if (i)
				close(fds[0]);
			return -1;
		}
	}
	int rc = setns(fds[0], CLONE_NEWUSER) < 0 || setns(fds[1], CLONE_NEWNS) < 0 ? -1 : 0;
	int err = errno;
	close(fds[0]);
	close(fds[1]);
	errno = err;
	if (rc < 0)
		return fail(TAG ": cannot join the node's container: %m");
	in_user_namespace = 1;
	return 0;
}

/* The first of an ordinary user's tasks on the node: its user namespace (the user mapped to themselves) with a
 * mount namespace of its own, private, and the container's root directory in USER_BASE. */
static int enter_user_container(void)
{
	if (enter_as_user(CLONE_NEWNS) < 0)
		return -1;
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 || mkdir_p(root, 0755) < 0)
		return fail(TAG ": cannot set up the container's namespaces: %m");
	return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac; (void)av;
	if (!opt_image && !opt_name)
		return 0;
	if (!ready || (direct && start_direct(sp) < 0)) {
		slurm_error("%s", failure[0] ? failure : TAG ": the container was not set up");
		return -1;
	}
	int task = 0;
	if (reused && spank_get_item(sp, S_TASK_ID, &task) == ESPANK_SUCCESS && task == 0)
		slurm_info("pyxis: reusing existing container filesystem");  /* pyxis's words, to the slurmd log */
	apply_environment(sp, root);
	if (enter_as_user(0) < 0) {
		slurm_error("%s", failure);
		return -1;
	}
	if (chdir(root) < 0 || chroot(".") < 0) {
		slurm_error(TAG ": chroot %s: %m", root);
		return -1;
	}
	if (chdir(workdir) < 0) {
		slurm_error("pyxis: couldn't chdir to %s: %m", workdir);  /* pyxis's words */
		return -1;
	}
	spank_setenv(sp, "PWD", workdir, 1);
	return 0;
}
