/*
 * kit_pyxis.h: what the stand-in's files share. The plugin itself, and which file runs where and as whom, in
 * args.c's opening comment.
 */
#ifndef KIT_PYXIS_H
#define KIT_PYXIS_H

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

#define TAG "kit-pyxis"
#define BASE "/tmp/kit-pyxis"  /* a tmpfs in the step's own mount namespace */
#define USER_BASE BASE "/user"  /* the job's user's, in it: their squashfuse-mode container (start_direct_user) */

/* Nothing below is the plugin's to export: slurmstepd's own symbols of the same names must not bind to these. */
#pragma GCC visibility push(hidden)

/* args.c: what the user asked for (pyxis's flags) and the plugstack.conf line */
extern char *opt_image, *opt_mounts, *opt_workdir, *opt_env, *opt_name;
extern int opt_writable, opt_mount_home, opt_remap_root;
extern int use_squashfuse;  /* plugstack.conf: use_squashfuse=1, pyxis's setting */
extern int native_overlayfs;  /* plugstack.conf: native_overlayfs=0, as a site's ENROOT_NATIVE_OVERLAYFS=no */
extern int job_scope;  /* plugstack.conf: container_scope=job, pyxis's: named containers are the job's */
extern char *kit_data;  /* plugstack.conf: kit_data=DIR, the nodes' enroot directories (DIR/NODE/data) */
/* common.c: the job, as slurmstepd was told it (slurmstepd.c sets it) */
extern uint32_t job_id;
extern uid_t job_uid;  /* the job's user: named containers are theirs (DATA/user-UID), as enroot's data path */
extern gid_t job_gid, *job_gids;  /* and their groups: the paths they name are opened as them (open_as_user) */
extern int job_ngids;
extern char failure[1024];  /* the first error of the container's setup (fail) */
/* slurmstepd.c: the container */
extern char root[256];
extern char workdir[4096];
extern int ready, reused, direct;
/* fuse.c */
extern const char *fuse_pids;
extern pid_t squashfuse_pid;
/* mounts.c */
extern const char *const HOST_FILES[];

/* args.c */
int parse_config(int ac, char **av);
int kept(const char *name);

/* common.c */
int fail(const char *fmt, ...);
int mkdir_p(const char *path, mode_t mode);
int open_in(int rootfd, const char *path, int flags, mode_t mode);
FILE *fopen_in(const char *root, const char *file);
const char *fd_path(char *buf, int fd);
int open_as_user(const char *path, int flags);
int run_as(char *const argv[], int as_root, int dirfd, int image, int out);
int write_proc(const char *path, const char *text);

/* mounts.c */
int run_mount(const char *image, const char *dir);
unsigned long kept_flags(const char *path);
int bind_mount(const char *root, const char *src, const char *dst, unsigned long flags);
int mount_in(const char *root, const char *dst, const char *type, unsigned long flags, const char *opts);
int user_mounts(const char *root);
void make_targets_in(const char *upper);

/* image.c */
int mount_squashfs(const char *dir);
int valid_name(const char *name);
int unpack(const char *dir);

/* rootfs.c */
char *image_setting(const char *root, const char *file, const char *name, char sep);
int image_user(const char *root, uid_t uid, char *name, char *home, char *shell, size_t size);
int named(const char *line, const char *const *names);
int add_job_user(const char *root);
void default_workdir(const char *root, const char *home, char *out, size_t size);

/* fuse.c */
int mount_squashfuse(const char *dir);
int mount_overlay(const char *opts);
void stop_fuse_daemons(const char *path, uid_t owner);

/* slurmstepd.c */
int mount_image(const char *base);
int finish_container(spank_t sp);
void set_workdir(void);
int make_container(spank_t sp);

/* task.c */
int start_direct(spank_t sp);

#pragma GCC visibility pop

#endif
