/*
 * common.c: helpers of every file: the first failure, paths inside a root (openat2 RESOLVE_IN_ROOT), and the job's
 * user's credentials for what they name (a path opened as them, a program run as them).
 */
#include "kit_pyxis.h"

uint32_t job_id;
uid_t job_uid;
gid_t job_gid, *job_gids;
int job_ngids;

/* The first error of the container's setup (in slurmstepd, where only the
 * slurmd log would see it): every task of the step reports it and fails. */
char failure[1024];

int fail(const char *fmt, ...)
{
	if (!failure[0]) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(failure, sizeof(failure), fmt, ap);
		va_end(ap);
	}
	return -1;
}

int mkdir_p(const char *path, mode_t mode)
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
int open_in(int rootfd, const char *path, int flags, mode_t mode)
{
	struct open_how how = { .flags = (unsigned long long)(flags | O_CLOEXEC),
				.mode = (flags & O_CREAT) ? mode : 0,
				.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
	const char *rel = path + strspn(path, "/");
	return (int)syscall(SYS_openat2, rootfd, *rel ? rel : ".", &how, sizeof(how));
}

/* FILE of the image under ROOT opened for reading inside it (open_in): an image's symlink to a host file
 * (/etc/environment -> a root-only configuration) is resolved in the image, never on the host. */
FILE *fopen_in(const char *root, const char *file)
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

/* "/proc/self/fd/FD" into BUF (64 bytes): a descriptor's path for mount(2) and mount(8). */
const char *fd_path(char *buf, int fd)
{
	snprintf(buf, 64, "/proc/self/fd/%d", fd);
	return buf;
}

/* PATH opened (FLAGS: O_PATH for what is bound, O_RDONLY for an image, read) with the job's user's credentials,
 * as enroot opens what its user names: a child that is them opens it and hands the descriptor back. slurmstepd
 * is root here, and a path it resolved itself would reach what the user cannot (a file behind a directory
 * closed to them, an image only root reads); the mount is then of that descriptor. */
int open_as_user(const char *path, int flags)
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

/* ARGV run to its end (its output to /dev/null), as the job's user unless AS_ROOT (root's job: as root), in
 * directory DIRFD (-1: this one), with IMAGE (>= 0) as its descriptor 3; OUT (>= 0) its output instead. Its exit
 * status; -1 when it did not run or exit. What reads or writes a user's image runs so: root never parses it. */
int run_as(char *const argv[], int as_root, int dirfd, int image, int out)
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

/* Write TEXT to the /proc file PATH (a user namespace's maps). */
int write_proc(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	ssize_t len = (ssize_t)strlen(text);
	int ok = fd >= 0 && write(fd, text, (size_t)len) == len;
	if (fd >= 0)
		close(fd);
	return ok ? 0 : -1;
}
