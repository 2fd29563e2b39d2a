/*
 * rootfs.c: files inside the container's root, read and written only through it (open_in): the image's settings,
 * its passwd and group (enroot's 10-shadow.sh hook), the user's home, the workdir.
 */
#include "kit_pyxis.h"

/* The value of NAME in a KEY=VALUE (SEP '=') or "KEY VALUE" (SEP ' ': blanks) file of the image; NULL if none. */
char *image_setting(const char *root, const char *file, const char *name, char sep)
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
int image_user(const char *root, uid_t uid, char *name, char *home, char *shell, size_t size)
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
int named(const char *line, const char *const *names)
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
int add_job_user(const char *root)
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

/* The working directory enroot's /etc/rc changes to (its `cd "DIR"` line),
 * else HOME: where a task starts without --container-workdir. */
void default_workdir(const char *root, const char *home, char *out, size_t size)
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
