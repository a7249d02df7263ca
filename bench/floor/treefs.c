/* The floor for benchmark row 7: the smallest C daemon on libfuse 3's low-level API that
 * serves a tree of empty files, answering as tensorfs does (READDIRPLUS with attributes,
 * opendir answered ENOSYS so listings stay cached, day-long timeouts).  What `find` or
 * `ls -lR` costs over it is what FUSE itself costs on this machine; tensorfs can only add.
 *
 *   treefs PATHS MOUNTPOINT      PATHS: one file path per line, relative, "/"-separated
 *
 * Built by bench/run.py when the fuse3 headers are there (make bench installs them).
 */
#define FUSE_USE_VERSION 34
#include <errno.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct node { char *name; int dir; size_t *kids, nkids, cap; } node;
static node *nodes;
static size_t n_nodes, n_cap;
static const double DAY = 86400;

static size_t child(size_t parent, const char *name, int dir) {
    node *p = &nodes[parent];
    for (size_t i = 0; i < p->nkids; i++)
        if (!strcmp(nodes[p->kids[i]].name, name)) return p->kids[i];
    if (n_nodes == n_cap) { n_cap *= 2; nodes = realloc(nodes, n_cap * sizeof *nodes); }
    size_t id = n_nodes++;
    nodes[id] = (node){strdup(name), dir, NULL, 0, 0};
    p = &nodes[parent];
    if (p->nkids == p->cap) { p->cap = p->cap ? 2 * p->cap : 4; p->kids = realloc(p->kids, p->cap * sizeof(size_t)); }
    p->kids[p->nkids++] = id;
    return id;
}

static void fill(size_t id, struct stat *st) {
    memset(st, 0, sizeof *st);
    st->st_ino = id + 1;
    st->st_mode = nodes[id].dir ? S_IFDIR | 0555 : S_IFREG | 0444;
    st->st_nlink = nodes[id].dir ? 2 : 1;
}

static void entry(size_t id, struct fuse_entry_param *e) {
    memset(e, 0, sizeof *e);
    e->ino = id + 1;
    e->attr_timeout = e->entry_timeout = DAY;
    fill(id, &e->attr);
}

static void do_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    node *p = &nodes[parent - 1];
    struct fuse_entry_param e;
    for (size_t i = 0; i < p->nkids; i++)
        if (!strcmp(nodes[p->kids[i]].name, name)) { entry(p->kids[i], &e); fuse_reply_entry(req, &e); return; }
    memset(&e, 0, sizeof e);
    e.entry_timeout = DAY;
    fuse_reply_entry(req, &e);
}

static void do_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    struct stat st;
    (void)fi;
    fill(ino - 1, &st);
    fuse_reply_attr(req, &st, DAY);
}

static void do_no_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino; (void)fi;
    fuse_reply_err(req, ENOSYS);
}

static void do_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    node *p = &nodes[ino - 1];
    char *buf = malloc(size);
    size_t used = 0;
    struct fuse_entry_param e;
    (void)fi;
    for (size_t i = off; i < p->nkids + 2; i++) {
        const char *name = i == 0 ? "." : i == 1 ? ".." : nodes[p->kids[i - 2]].name;
        if (i < 2) { memset(&e, 0, sizeof e); e.attr.st_ino = ino; e.attr.st_mode = S_IFDIR; }
        else entry(p->kids[i - 2], &e);
        size_t n = fuse_add_direntry_plus(req, buf + used, size - used, name, &e, i + 1);
        if (n > size - used) break;
        used += n;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void do_init(void *userdata, struct fuse_conn_info *conn) {
    (void)userdata;
    conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s PATHS MOUNTPOINT\n", argv[0]); return 2; }
    n_cap = 1024;
    nodes = malloc(n_cap * sizeof *nodes);
    nodes[0] = (node){strdup(""), 1, NULL, 0, 0};
    n_nodes = 1;
    FILE *f = fopen(argv[1], "r");
    if (!f) { perror(argv[1]); return 1; }
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        size_t at = 0;
        char *s = line, *slash;
        while ((slash = strchr(s, '/'))) { *slash = 0; at = child(at, s, 1); s = slash + 1; }
        if (*s) child(at, s, 0);
    }
    fclose(f);
    struct fuse_lowlevel_ops ops = {0};
    ops.init = do_init;
    ops.lookup = do_lookup;
    ops.getattr = do_getattr;
    ops.open = do_no_open;
    ops.opendir = do_no_open;
    ops.readdirplus = do_readdirplus;
    char *av[] = {argv[0], "-o", "ro,default_permissions,fsname=treefs", NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, av);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se || fuse_set_signal_handlers(se) || fuse_session_mount(se, argv[2])) return 1;
    int r = fuse_session_loop(se);
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return r ? 1 : 0;
}
