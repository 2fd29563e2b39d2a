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
 * Built by `kit cluster up` against Debian's libslurm-dev headers.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <grp.h>
#include <linux/openat2.h>
#include <pwd.h>
#include <sys/syscall.h>
#include <sys/mount.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(kit_pyxis, 1);

#define TAG "kit-pyxis"
#define BASE "/tmp/kit-pyxis"  /* a tmpfs in the step's own mount namespace */
#define USER_BASE BASE "/user"  /* the job's user's, in it: their squashfuse-mode container (start_direct_user) */

static char *opt_image, *opt_mounts, *opt_workdir, *opt_env, *opt_name;
static int opt_writable, opt_mount_home, opt_remap_root;
static int use_squashfuse;  /* plugstack.conf: use_squashfuse=1, pyxis's setting */
static int native_overlayfs = 1;  /* plugstack.conf: native_overlayfs=0, as a site's ENROOT_NATIVE_OVERLAYFS=no */
static int job_scope;       /* plugstack.conf: container_scope=job, pyxis's: named containers are the job's */
static char *kit_data;      /* plugstack.conf: kit_data=DIR, the nodes' enroot directories (DIR/NODE/data) */
static uint32_t job_id;
static uid_t job_uid;       /* the job's user: named containers are theirs (DATA/user-UID), as enroot's data path */
static gid_t job_gid, *job_gids;  /* and their groups: the paths they name are opened as them (open_as_user) */
static int job_ngids;

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
static int parse_config(int ac, char **av)
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

/* The first error of the container's setup (in slurmstepd, where only the
 * slurmd log would see it): every task of the step reports it and fails. */
static char failure[1024];

static int fail(const char *fmt, ...)
{
	if (!failure[0]) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(failure, sizeof(failure), fmt, ap);
		va_end(ap);
	}
	return -1;
}

static int mkdir_p(const char *path, mode_t mode)
{
	char buf[4096];
	size_t len = strlen(path);
	if (len >= sizeof(buf))
		return -1;
	memcpy(buf, path, len + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			if (mkdir(buf, mode) < 0 && errno != EEXIST)
				return -1;
			*p = '/';
		}
	}
	if (mkdir(buf, mode) < 0 && errno != EEXIST)
		return -1;
	return 0;
}

/* PATH (absolute, in the image) opened as if ROOTFD were "/": the image's symlinks, ".." included, stay in
 * it (slurmstepd is root where this runs in create mode; the image is the user's). */
static int open_in(int rootfd, const char *path, int flags, mode_t mode)
{
	struct open_how how = { .flags = (unsigned long long)(flags | O_CLOEXEC),
				.mode = (flags & O_CREAT) ? mode : 0,
				.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
	const char *rel = path + strspn(path, "/");
	return (int)syscall(SYS_openat2, rootfd, *rel ? rel : ".", &how, sizeof(how));
}

/* FILE of the image under ROOT opened for reading inside it (open_in): an image's symlink to a host file
 * (/etc/environment -> a root-only configuration) is resolved in the image, never on the host. */
static FILE *fopen_in(const char *root, const char *file)
{
	int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	int fd = rootfd < 0 ? -1 : open_in(rootfd, file, O_RDONLY, 0);
	if (rootfd >= 0)
		close(rootfd);
	FILE *f = fd < 0 ? NULL : fdopen(fd, "r");
	if (!f && fd >= 0)
		close(fd);
	return f;
}

/* A mount destination's ".." component: refused (a destination names a place in the container). */
static int climbs(const char *dst)
{
	for (const char *p = dst; (p = strstr(p, "..")); p += 2)
		if ((p == dst || p[-1] == '/') && (p[2] == '/' || p[2] == '\0'))
			return 1;
	return 0;
}

/* DST (absolute, in the container) under ROOTFD, resolved inside it (open_in) with its missing directories made
 * there and, unless IS_DIR, its last component an empty file: an O_PATH descriptor of it, to mount on through
 * /proc/self/fd (mount(2) given the path as text would follow a symlink the image or the user put there onto the
 * host). -1 and errno; EINVAL for a destination that is not absolute or climbs with "..". */
static int target_in(int rootfd, const char *dst, int is_dir)
{
	char path[4096];
	size_t len = strlen(dst);
	if (dst[0] != '/' || climbs(dst) || len >= sizeof(path)) {
		errno = EINVAL;
		return -1;
	}
	memcpy(path, dst, len + 1);
	for (char *p = path + 1;; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		char keep = *p, *name;
		*p = '\0';
		name = strrchr(path, '/') + 1;
		int fd = *name ? open_in(rootfd, path, O_PATH, 0) : -2;
		if (fd >= 0) {
			close(fd);
		} else if (fd == -1 && errno == ENOENT) {
			name[-1] = '\0';
			int parent = open_in(rootfd, path[0] ? path : "/", O_PATH | O_DIRECTORY, 0);
			name[-1] = '/';
			int made = -1;
			if (parent >= 0 && (keep || is_dir)) {
				made = mkdirat(parent, name, 0755);
			} else if (parent >= 0) {
				int f = openat(parent, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
				made = f < 0 ? -1 : close(f);
			}
			if (made < 0 && errno == EEXIST)
				made = 0;
			int err = errno;
			if (parent >= 0)
				close(parent);
			errno = err;
			if (made < 0)
				return -1;
		} else if (fd == -1) {
			return -1;
		}
		*p = keep;
		if (!keep)
			break;
	}
	return open_in(rootfd, dst, O_PATH, 0);
}

/* "/proc/self/fd/FD" into BUF (64 bytes): a descriptor's path for mount(2) and mount(8). */
static const char *fd_path(char *buf, int fd)
{
	snprintf(buf, 64, "/proc/self/fd/%d", fd);
	return buf;
}

static int run_mount(const char *image, const char *dir)
{
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);
		if (null >= 0)
			dup2(null, 1);
		execl("/bin/mount", "mount", "-t", "squashfs", "-o", "loop,ro,nodev,nosuid", image, dir, (char *)NULL);
		_exit(127);
	}
	int status;
	if (waitpid(pid, &status, 0) < 0)
		return -1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* Mount flags pyxis (through enroot's fstab) honours; unknown ones are accepted silently, as there. */
static unsigned long mount_flag(const char *f)
{
	static const struct { const char *name; unsigned long flag; } known[] = {
		{ "ro", MS_RDONLY }, { "nosuid", MS_NOSUID }, { "nodev", MS_NODEV }, { "noexec", MS_NOEXEC },
		{ "noatime", MS_NOATIME }, { "nodiratime", MS_NODIRATIME }, { "relatime", MS_RELATIME },
	};
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (strcmp(f, known[i].name) == 0)
			return known[i].flag;
	return 0;
}

/* The flags PATH's mount has that a bind remount must keep: in a user namespace the kernel refuses to clear
 * those it locked (nosuid, nodev, noexec, the atime ones of a mount from outside it). */
static unsigned long kept_flags(const char *path)
{
	struct statvfs v;
	if (statvfs(path, &v) < 0)
		return 0;
	unsigned long out = 0;
	const unsigned long map[][2] = { { ST_NOSUID, MS_NOSUID }, { ST_NODEV, MS_NODEV }, { ST_NOEXEC, MS_NOEXEC },
					 { ST_NOATIME, MS_NOATIME }, { ST_NODIRATIME, MS_NODIRATIME },
					 { ST_RELATIME, MS_RELATIME }, { ST_RDONLY, MS_RDONLY } };
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (v.f_flag & map[i][0])
			out |= map[i][1];
	return out;
}

/* PATH opened (FLAGS: O_PATH for what is bound, O_RDONLY for an image, read) with the job's user's credentials,
 * as enroot opens what its user names: a child that is them opens it and hands the descriptor back. slurmstepd
 * is root here, and a path it resolved itself would reach what the user cannot (a file behind a directory
 * closed to them, an image only root reads); the mount is then of that descriptor. */
static int open_as_user(const char *path, int flags)
{
	if (job_uid == 0 || geteuid() != 0)
		return open(path, flags | O_CLOEXEC);
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		int fd = -1, err = 0;
		if (setgroups(job_ngids, job_gids) < 0 || setgid(job_gid) < 0 || setuid(job_uid) < 0 ||
		    (fd = open(path, flags | O_CLOEXEC)) < 0)
			err = errno;
		char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
		struct iovec iov = { .iov_base = &err, .iov_len = sizeof(err) };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
		if (fd >= 0) {
			msg.msg_control = cbuf;
			msg.msg_controllen = sizeof(cbuf);
			struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(c), &fd, sizeof(int));
		}
		_exit(sendmsg(sv[1], &msg, 0) < 0);
	}
	close(sv[1]);
	int fd = -1, err = EIO;
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = &err, .iov_len = sizeof(err) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	if (pid > 0 && recvmsg(sv[0], &msg, MSG_CMSG_CLOEXEC) > 0 && err == 0) {
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		if (c && c->cmsg_type == SCM_RIGHTS)
			memcpy(&fd, CMSG_DATA(c), sizeof(int));
	}
	close(sv[0]);
	if (pid > 0)
		waitpid(pid, NULL, 0);
	errno = fd < 0 ? err : 0;
	return fd;
}

/* mount(2) FLAGS as mount_setattr's attributes (set; the atime ones clear the others first). */
static void mount_attrs(unsigned long flags, struct mount_attr *attr)
{
	const unsigned long map[][2] = { { MS_RDONLY, MOUNT_ATTR_RDONLY }, { MS_NOSUID, MOUNT_ATTR_NOSUID },
					 { MS_NODEV, MOUNT_ATTR_NODEV }, { MS_NOEXEC, MOUNT_ATTR_NOEXEC },
					 { MS_NODIRATIME, MOUNT_ATTR_NODIRATIME } };
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (flags & map[i][0])
			attr->attr_set |= map[i][1];
	if (flags & (MS_NOATIME | MS_RELATIME)) {
		attr->attr_clr |= MOUNT_ATTR__ATIME;
		attr->attr_set |= flags & MS_NOATIME ? MOUNT_ATTR_NOATIME : MOUNT_ATTR_RELATIME;
	}
}

/* SRC (a descriptor) bound, with its submounts and FLAGS, onto TARGET (a descriptor from target_in): a detached
 * copy of its tree given the flags before it is attached, so the flags are never applied to a path read again. */
static int bind_fd(int src, int target, unsigned long flags)
{
	int tree = open_tree(src, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH);
	if (tree < 0)
		return -1;
	struct mount_attr attr = { 0 };
	mount_attrs(flags, &attr);
	int rc = ((attr.attr_set || attr.attr_clr) &&
		  mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof(attr)) < 0) ||
		 move_mount(tree, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0 ? -1 : 0;
	int err = errno;
	close(tree);
	errno = err;
	return rc;
}

/* SRC (opened as the job's user) bound on DST inside ROOT (resolved there: target_in), with FLAGS. */
static int bind_mount(const char *root, const char *src, const char *dst, unsigned long flags)
{
	struct stat st;
	int fd = open_as_user(src, O_PATH);
	if (fd < 0 || fstat(fd, &st) < 0) {
		fail(TAG ": --container-mounts: source %s: %m", src);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	int target = rootfd < 0 ? -1 : target_in(rootfd, dst, S_ISDIR(st.st_mode));
	int rc = -1;
	if (target < 0)
		fail(TAG ": cannot create mount point %s in the container: %m", dst);
	else if (bind_fd(fd, target, flags) < 0)
		fail(TAG ": bind %s:%s: %m", src, dst);
	else
		rc = 0;
	for (int *f = (int[]){ fd, rootfd, target }, i = 0; i < 3; i++)
		if (f[i] >= 0)
			close(f[i]);
	return rc;
}

/* A new file system of TYPE (mount FLAGS, OPTS) on DST inside ROOT (resolved there: target_in); a failure said. */
static int mount_in(const char *root, const char *dst, const char *type, unsigned long flags, const char *opts)
{
	char at[64];
	int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	int target = rootfd < 0 ? -1 : target_in(rootfd, dst, 1);
	int rc = target < 0 || mount(type, fd_path(at, target), type, flags, opts) < 0 ? -1 : 0;
	int err = errno;
	if (target >= 0)
		close(target);
	if (rootfd >= 0)
		close(rootfd);
	errno = err;
	return rc < 0 ? fail(TAG ": %s on %s: %m", type, dst) : 0;
}

/* DST's mount point made inside ROOT (target_in), a directory or a file; nothing mounted. */
static void target_made(const char *root, const char *dst, int is_dir)
{
	int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	int target = rootfd < 0 ? -1 : target_in(rootfd, dst, is_dir);
	if (target >= 0)
		close(target);
	if (rootfd >= 0)
		close(rootfd);
}

/* SRC:DST[:FLAGS] entries, comma separated; FLAGS joined with '+'. */
/* Under a tmpfs the container gets (/tmp, /run): made there once it is mounted. */
static int under_tmpfs(const char *dst)
{
	return strncmp(dst, "/tmp/", 5) == 0 || strncmp(dst, "/run/", 5) == 0;
}

/* The --container-mounts entries mounted under ROOT, or with TARGETS_ONLY their mount points made there alone. */
static int user_mounts_as(const char *root, int targets_only)
{
	if (!opt_mounts || !*opt_mounts)
		return 0;
	char *all = strdup(opt_mounts), *save = NULL;
	int rc = 0;
	for (char *entry = strtok_r(all, ",", &save); entry && rc == 0; entry = strtok_r(NULL, ",", &save)) {
		char *src = entry, *dst = strchr(entry, ':'), *flags = NULL;
		if (dst) {
			*dst++ = '\0';
			flags = strchr(dst, ':');
			if (flags)
				*flags++ = '\0';
		} else {
			dst = src;
		}
		unsigned long mflags = 0;
		if (flags) {
			char *fsave = NULL;
			for (char *f = strtok_r(flags, "+", &fsave); f; f = strtok_r(NULL, "+", &fsave))
				mflags |= mount_flag(f);
		}
		if (dst[0] != '/' || climbs(dst)) {  /* pyxis: "mount target must be ... an absolute path" */
			rc = fail("pyxis: --container-mounts: mount target must be an absolute path inside the container, "
				  "without \"..\": %s", dst);
			continue;
		}
		struct stat st;
		if (targets_only && !under_tmpfs(dst) && (strcmp(src, "tmpfs") == 0 || stat(src, &st) == 0))
			target_made(root, dst, strcmp(src, "tmpfs") == 0 || S_ISDIR(st.st_mode));
		else if (!targets_only && strcmp(src, "tmpfs") == 0)
			rc = mount_in(root, dst, "tmpfs", mflags, NULL);
		else if (!targets_only)
			rc = bind_mount(root, src, dst, mflags);
	}
	free(all);
	return rc;
}

static int user_mounts(const char *root)
{
	return user_mounts_as(root, 0);
}

static const char *const HOST_FILES[] = { "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/etc/machine-id", NULL };

/* An ordinary user's container: the mount points it will need, made in the overlay's upper layer (theirs) before
 * it is mounted, where the image's directories (root's, unmapped in their namespace) would refuse them. */
static void make_targets_in(const char *upper)
{
	for (const char *const *f = HOST_FILES; *f; f++)
		if (access(*f, R_OK) == 0)
			target_made(upper, *f, 0);
	user_mounts_as(upper, 1);
}

static int kept(const char *name)
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

/* The value of NAME in a KEY=VALUE (SEP '=') or "KEY VALUE" (SEP ' ': blanks) file of the image; NULL if none. */
static char *image_setting(const char *root, const char *file, const char *name, char sep)
{
	char line[4096];
	size_t n = strlen(name);
	char *found = NULL;
	FILE *f = fopen_in(root, file);
	if (!f)
		return NULL;
	while (!found && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		char *p = line + strspn(line, " \t");
		if (strncmp(p, name, n) == 0 && (p[n] == sep || (sep == ' ' && p[n] == '\t')))
			found = strdup(p + n + 1 + strspn(p + n + 1, " \t"));
	}
	fclose(f);
	return found;
}

/* The image's /etc/passwd entry for UID: home directory and shell. */
static int image_user(const char *root, uid_t uid, char *name, char *home, char *shell, size_t size)
{
	char line[4096];
	FILE *f = fopen_in(root, "/etc/passwd");
	if (!f)
		return -1;
	int rc = -1;
	while (rc < 0 && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		char *field[7] = { 0 }, *p = line;
		int i = 0;
		for (; i < 7; i++) {
			field[i] = p;
			p = strchr(p, ':');
			if (!p)
				break;
			*p++ = '\0';
		}
		if (i == 6 && (uid_t)strtoul(field[2], NULL, 10) == uid) {
			snprintf(name, size, "%s", field[0]);
			snprintf(home, size, "%s", field[5]);
			snprintf(shell, size, "%s", field[6]);
			rc = 0;
		}
	}
	fclose(f);
	return rc;
}

/* The entry's name: the text before its first ':' (NAME, LEN) is one of NAMES. */
static int named(const char *line, const char *const *names)
{
	size_t len = strcspn(line, ":");
	for (; *names; names++)
		if (strlen(*names) == len && strncmp(line, *names, len) == 0)
			return 1;
	return 0;
}

/* The image's /etc/FILE (passwd, group) with FIRST (three entries: root, nobody, the job's user) first and
 * its own entries after, but for those names and _apt, as enroot's 10-shadow.sh leaves it; written to a
 * new file renamed over the old one, in the image's /etc. */
static int write_db(int rootfd, const char *file, const char *first, const char *const *names)
{
	char tmp[64], line[4096];
	int etc = open_in(rootfd, "/etc", O_PATH | O_DIRECTORY, 0);
	if (etc < 0)
		return -1;
	snprintf(tmp, sizeof(tmp), ".%s.kit-pyxis", file);
	int out = openat(etc, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	FILE *w = out >= 0 ? fdopen(out, "w") : NULL;
	if (!w) {
		if (out >= 0)
			close(out);
		close(etc);
		return -1;
	}
	fputs(first, w);
	snprintf(line, sizeof(line), "/etc/%s", file);
	int in = open_in(rootfd, line, O_RDONLY, 0);
	FILE *r = in >= 0 ? fdopen(in, "r") : NULL;
	while (r && fgets(line, sizeof(line), r))
		if (!named(line, names) && strncmp(line, "_apt:", 5) != 0)
			fputs(line, w);
	if (r)
		fclose(r);
	else if (in >= 0)
		close(in);
	int rc = fclose(w) == 0 && renameat(etc, tmp, etc, file) == 0 ? 0 : -1;
	close(etc);
	return rc;
}

/* The job user's home directory in the image, made where it is missing (its parents too, theirs, mode from
 * the image's login.defs UMASK), with the image's /etc/skel files in it. */
static void make_home(int rootfd, const char *home, uid_t uid, gid_t gid, mode_t mode)
{
	char path[4096];
	int fd = open_in(rootfd, home, O_PATH | O_DIRECTORY, 0);
	if (fd >= 0) {
		close(fd);
		return;
	}
	snprintf(path, sizeof(path), "%s", home);
	for (char *p = path + 1;; p++) {  /* mkdir -p, each directory made in its parent found in the image */
		if (*p != '/' && *p != '\0')
			continue;
		char keep = *p, *name;
		*p = '\0';
		name = strrchr(path, '/');
		*name = '\0';
		int parent = open_in(rootfd, path[0] ? path : "/", O_PATH | O_DIRECTORY, 0);
		*name = '/';
		if (parent < 0)
			return;
		if (mkdirat(parent, name + 1, mode) == 0 && (fchownat(parent, name + 1, uid, gid, AT_SYMLINK_NOFOLLOW) < 0 ||
							    fchmodat(parent, name + 1, mode, 0) < 0))
			slurm_info(TAG ": %s: %m", path);
		close(parent);
		*p = keep;
		if (!keep)
			break;
	}
	int dir = open_in(rootfd, home, O_RDONLY | O_DIRECTORY, 0);
	int skel = open_in(rootfd, "/etc/skel", O_RDONLY | O_DIRECTORY, 0);
	DIR *d = skel >= 0 ? fdopendir(skel) : NULL;
	struct dirent *e;
	while (dir >= 0 && d && (e = readdir(d))) {
		char buf[65536];
		ssize_t n;
		int src = e->d_type == DT_REG ? openat(skel, e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
		int dst = src >= 0 ? openat(dir, e->d_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644) : -1;
		while (dst >= 0 && (n = read(src, buf, sizeof(buf))) > 0 && write(dst, buf, (size_t)n) == n)
			;
		if (dst >= 0 && fchown(dst, uid, gid) < 0)
			slurm_info(TAG ": %s/%s: %m", home, e->d_name);
		if (src >= 0)
			close(src);
		if (dst >= 0)
			close(dst);
	}
	if (d)
		closedir(d);
	else if (skel >= 0)
		close(skel);
	if (dir >= 0)
		close(dir);
}

/* enroot's 10-shadow.sh hook, on the container's root ROOT before it is made read-only: root, nobody and the
 * job's user (their host entry: name, home, shell where the image has it, else /bin/sh) first in the image's
 * passwd, their groups in its group file, their home made. What the login variables are then read from. */
static int add_job_user(const char *root)
{
	struct passwd *pw = getpwuid(job_uid);
	struct group *gr = getgrgid(job_gid);
	if (!pw || !gr)
		return fail(TAG ": uid %u or gid %u has no entry on the node", (unsigned)job_uid, (unsigned)job_gid);
	char user[256], home[1024], shell[1024], group[256], entries[4096], path[4096];
	snprintf(user, sizeof(user), "%s", pw->pw_name);
	snprintf(home, sizeof(home), "%s", pw->pw_dir);
	snprintf(group, sizeof(group), "%s", gr->gr_name);
	int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		return fail(TAG ": %s: %m", root);
	int sh = open_in(rootfd, pw->pw_shell, O_PATH, 0);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", sh);
	char *useradd = image_setting(root, "/etc/default/useradd", "SHELL", '=');
	snprintf(shell, sizeof(shell), "%s", sh >= 0 && access(path, X_OK) == 0 ? pw->pw_shell :
		 useradd ? useradd : "/bin/sh");
	free(useradd);
	if (sh >= 0)
		close(sh);
	int n = snprintf(entries, sizeof(entries), "root:x:0:0:root:/root:%s\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n",
			 shell);
	if (job_uid != 0 && n > 0 && (size_t)n < sizeof(entries))  /* root's is the first line already */
		snprintf(entries + n, sizeof(entries) - (size_t)n, "%s:x:%u:%u:%s:%s:%s\n", user, (unsigned)job_uid,
			 (unsigned)job_gid, pw->pw_gecos, home, shell);
	const char *users[] = { "root", "nobody", user, NULL };
	int rc = write_db(rootfd, "passwd", entries, users);
	n = snprintf(entries, sizeof(entries), "root:x:0:\nnogroup:x:65534:\n");
	if (job_gid != 0 && n > 0 && (size_t)n < sizeof(entries))
		snprintf(entries + n, sizeof(entries) - (size_t)n, "%s:x:%u:\n", group, (unsigned)job_gid);
	const char *groups[] = { "root", "nogroup", group, NULL };
	rc |= write_db(rootfd, "group", entries, groups);
	char *umask_text = image_setting(root, "/etc/login.defs", "UMASK", ' ');
	mode_t mask = umask_text ? (mode_t)strtoul(umask_text, NULL, 8) & 0777 : 077;
	free(umask_text);
	make_home(rootfd, home, job_uid, job_gid, 0777 & ~mask);
	close(rootfd);
	return rc < 0 ? fail(TAG ": cannot add uid %u to the image's passwd and group: %m", (unsigned)job_uid) : 0;
}

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

/* The working directory enroot's /etc/rc changes to (its `cd "DIR"` line),
 * else HOME: where a task starts without --container-workdir. */
static void default_workdir(const char *root, const char *home, char *out, size_t size)
{
	char line[4096];
	snprintf(out, size, "%s", home[0] ? home : "/");
	FILE *f = fopen_in(root, "/etc/rc");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "cd \"", 4) == 0) {
			char *end = strchr(line + 4, '"');
			if (end) {
				*end = '\0';
				snprintf(out, size, "%s", line + 4);
			}
			break;
		}
	}
	fclose(f);
}

/* ARGV run to its end (its output to /dev/null), as the job's user unless AS_ROOT (root's job: as root), in
 * directory DIRFD (-1: this one), with IMAGE (>= 0) as its descriptor 3; OUT (>= 0) its output instead. Its exit
 * status; -1 when it did not run or exit. What reads or writes a user's image runs so: root never parses it. */
static int run_as(char *const argv[], int as_root, int dirfd, int image, int out)
{
	pid_t pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);
		if (out >= 0 || null >= 0)
			dup2(out >= 0 ? out : null, 1);
		if ((image >= 0 && dup2(image, 3) < 0) || (dirfd >= 0 && fchdir(dirfd) < 0))
			_exit(126);
		if (!as_root && job_uid != 0 && geteuid() == 0 &&
		    (setgroups(job_ngids, job_gids) < 0 || setgid(job_gid) < 0 || setuid(job_uid) < 0))
			_exit(126);
		closefrom(4);
		execvp(argv[0], argv);
		_exit(127);
	}
	int status;
	if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

/* The image opened for reading as the job's user (what they cannot read is not theirs to run); -1 (said) if not. */
static int open_image(void)
{
	int fd = open_as_user(opt_image, O_RDONLY);
	return fd < 0 ? fail(TAG ": --container-image: cannot open %s: %m", opt_image) : fd;
}

/* The image (FD, the user's) as root may mount it: FD itself, a new descriptor, when nobody but root can change
 * it; else a copy that is root's alone, made now (an unnamed file of the node's data directory, gone with the loop
 * device that holds it last): a file its user may rewrite at any moment is never read twice, so what was checked
 * is what the kernel reads. -1 on failure. */
static int image_copy(int fd)
{
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		return -1;
	if (st.st_uid == 0 && !(st.st_mode & (S_IWGRP | S_IWOTH)))
		return fcntl(fd, F_DUPFD_CLOEXEC, 0);
	const char *data = getenv("KIT_PYXIS_DATA");
	int out = data && *data ? open(data, O_TMPFILE | O_RDWR | O_CLOEXEC, 0644) : -1;
	if (out < 0)
		out = open("/var/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
	off_t off = 0;
	ssize_t n = 1;
	while (out >= 0 && n > 0)
		n = sendfile(out, fd, &off, 1 << 30);
	if (out >= 0 && (n < 0 || off != st.st_size)) {
		close(out);
		return -1;
	}
	return out;
}

/* The image's first device node (unsquashfs -lls of IMAGE, a descriptor, as the job's user; nothing unpacked) into
 * NODE: 1 if it has one, 0 if none, -1 when it cannot be listed (a corrupt image is no image). */
static int device_node(int image, char *node, size_t size)
{
	char *const argv[] = { "unsquashfs", "-lls", "-d", "", "/proc/self/fd/3", NULL };
	int out = memfd_create("kit-pyxis-listing", MFD_CLOEXEC);
	int status = out < 0 ? -1 : run_as(argv, 0, -1, image, out);
	FILE *f = status == 0 && lseek(out, 0, SEEK_SET) == 0 ? fdopen(out, "r") : NULL;
	char line[4096];
	int found = 0;
	while (f && !found && fgets(line, sizeof(line), f))
		if ((line[0] == 'c' || line[0] == 'b') && strrchr(line, ' ')) {
			line[strcspn(line, "\n")] = '\0';
			snprintf(node, size, "%s", strrchr(line, ' ') + 1);
			found = 1;
		}
	if (f)
		fclose(f);
	else if (out >= 0)
		close(out);
	return status == 0 ? found : -1;
}

/* IMAGE (a descriptor) listed before anything uses it: refused, in pyxis's and enroot's words, when it cannot be
 * (enroot: "Invalid image format"), and for an ordinary user when it holds a device node (enroot's create mode
 * unpacks it as them: unsquashfs cannot make one). 0 when it may be used; -1, said, if not. */
static int checked(int image)
{
	char node[4096];
	int has = device_node(image, node, sizeof(node));
	if (has < 0)
		return fail("pyxis: failed to create container filesystem for image: %s: Invalid image format (unsquashfs "
			    "cannot list it)", opt_image);
	if (has && job_uid != 0)
		return fail("pyxis: failed to create container filesystem for image: %s: create_inode: could not create "
			    "device %s, because you're not superuser!", opt_image, node);
	return 0;
}

/* Create mode: the image loop-mounted read-only, nodev and nosuid on DIR, from a copy only root can change
 * (image_copy), listed (checked) before the kernel reads it. */
static int mount_squashfs(const char *dir)
{
	char path[64];
	int fd = open_image();
	if (fd < 0)
		return -1;
	int copy = image_copy(fd);
	close(fd);
	if (copy < 0)
		return fail(TAG ": --container-image: cannot copy %s where only root writes: %m", opt_image);
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)getpid(), copy);
	int rc = checked(copy) < 0 ? -1 : run_mount(path, dir) < 0 ? fail(TAG ": --container-image: cannot mount %s as "
									 "squashfs", opt_image) : 0;
	close(copy);  /* the loop device holds it now */
	return rc;
}

/* A container name as pyxis's: letters, digits, '.', '_' and '-'; nothing that names a path. */
static int valid_name(const char *name)
{
	static const char ok[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";
	return name[0] && strspn(name, ok) == strlen(name);
}

/* A named container made as `enroot create` makes it, as the job's user: IMAGE unpacked by unsquashfs running as
 * them (the files theirs; unsquashfs as an ordinary user makes no device node and no other owner's file) into
 * DIR.new, made by root for them in the data directory, which is root's (0700), and renamed to DIR once whole: an
 * interrupted unpack leaves no half container behind. */
static int unpack(const char *dir)
{
	char tmp[4200];
	snprintf(tmp, sizeof(tmp), "%s.new", dir);
	char *const rm[] = { "rm", "-rf", "--one-file-system", "--", tmp, NULL };
	char *const unsquashfs[] = { "unsquashfs", "-f", "-q", "-no-progress", "-d", ".", "/proc/self/fd/3", NULL };
	int image = open_image();
	if (image < 0 || checked(image) < 0) {
		if (image >= 0)
			close(image);
		return -1;
	}
	int into = -1, rc = -1;
	if (run_as(rm, 1, -1, -1, -1) == 0 && mkdir(tmp, 0700) == 0 && chown(tmp, job_uid, job_gid) == 0 &&
	    (into = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) >= 0 &&
	    run_as(unsquashfs, 0, into, image, -1) == 0 && rename(tmp, dir) == 0)
		rc = 0;
	int err = errno;
	if (into >= 0)
		close(into);
	close(image);
	errno = err;
	return rc < 0 ? fail(TAG ": --container-image: cannot unpack %s into %s", opt_image, dir) : 0;
}

static char root[256];
static char workdir[4096];
static int ready, reused, direct;

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

static const char *fuse_pids = BASE "/fuse.pids";  /* USER_BASE's for an ordinary user's container */
static pid_t squashfuse_pid;  /* the first daemon recorded: whose namespaces an ordinary user's later tasks join */

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
static int mount_squashfuse(const char *dir)
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
static int mount_overlay(const char *opts)
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

/* The image's root on ROOT: a named container's kept directory, or an overlay over the
 * squashfs, mounted through a loop device or (direct) through squashfuse — as enroot does
 * with its default ENROOT_NATIVE_OVERLAYFS (a kernel overlay, no fuse-overlayfs). */
static int mount_image(const char *base)
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
static int finish_container(spank_t sp)
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

static void set_workdir(void)
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
static int make_container(spank_t sp)
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

/* Direct startup, in each task before it starts: the first task of the node (under a lock
 * in the step's tmpfs) mounts the root, its FUSE daemons below itself; the others wait for
 * it and take its outcome (BASE/setup: "ok", or the failure). */
static int enter_user_container(void);
static int join_container(pid_t pid);
static int in_user_namespace;  /* the task is in its container's user namespace already (start_direct) */

/* Direct startup, in each task before it starts: the first task of the node (under a lock in the step's
 * tmpfs) mounts the root, its FUSE daemons below itself; the others wait for it and take its outcome
 * (BASE/setup: "ok PID", PID its squashfuse, or the failure). An ordinary user's tasks do the same in
 * USER_BASE, as enroot does for them: the first makes a user namespace mapping the user to themselves with a
 * mount namespace of its own and mounts the image there; the others join that squashfuse's namespaces. */
static int start_direct(spank_t sp)
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

/* Write TEXT to the /proc file PATH (a user namespace's maps). */
static int write_proc(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	ssize_t len = (ssize_t)strlen(text);
	int ok = fd >= 0 && write(fd, text, (size_t)len) == len;
	if (fd >= 0)
		close(fd);
	return ok ? 0 : -1;
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

/* Direct startup: the FUSE daemons end with the step (they may have outlived the task
 * that started them, as enroot's do). */
static void stop_fuse_daemons(const char *path, uid_t owner)
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
