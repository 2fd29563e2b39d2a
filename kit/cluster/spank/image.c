/*
 * image.c: the user's image file: opened as them, copied where root alone can change it, listed as them, loop-
 * mounted nodev,nosuid; a named container unpacked by unsquashfs running as them (enroot create).
 */
#include "kit_pyxis.h"

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
int mount_squashfs(const char *dir)
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
int valid_name(const char *name)
{
	static const char ok[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";
	return name[0] && strspn(name, ok) == strlen(name);
}

/* A named container made as `enroot create` makes it, as the job's user: IMAGE unpacked by unsquashfs running as
 * them (the files theirs; unsquashfs as an ordinary user makes no device node and no other owner's file) into
 * DIR.new, made by root for them in the data directory, which is root's (0700), and renamed to DIR once whole: an
 * interrupted unpack leaves no half container behind. */
int unpack(const char *dir)
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
