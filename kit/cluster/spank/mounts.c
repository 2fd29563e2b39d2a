/*
 * mounts.c: what is mounted into the container: each destination resolved inside its root, mounted through a
 * descriptor (as root in slurmstepd in create mode; as the user, in their namespaces, in squashfuse mode).
 */
#include "kit_pyxis.h"

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

int run_mount(const char *image, const char *dir)
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
unsigned long kept_flags(const char *path)
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
int bind_mount(const char *root, const char *src, const char *dst, unsigned long flags)
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
int mount_in(const char *root, const char *dst, const char *type, unsigned long flags, const char *opts)
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

int user_mounts(const char *root)
{
	return user_mounts_as(root, 0);
}

const char *const HOST_FILES[] = { "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/etc/machine-id", NULL };

/* An ordinary user's container: the mount points it will need, made in the overlay's upper layer (theirs) before
 * it is mounted, where the image's directories (root's, unmapped in their namespace) would refuse them. */
void make_targets_in(const char *upper)
{
	for (const char *const *f = HOST_FILES; *f; f++)
		if (access(*f, R_OK) == 0)
			target_made(upper, *f, 0);
	user_mounts_as(upper, 1);
}
