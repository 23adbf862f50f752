/* posix_spawnp and posix_spawn's file actions, libc untraced: each exec
 * runs in the child inside libc. A PATH search ("true"), a name on no
 * PATH entry (ENOENT), a file that is not executable (EACCES), a
 * relative name after a chdir file action ("./true" in /bin) and, when
 * given as argv[1], a #! script (its interpreter /bin/true). Each child
 * gets the extra argument "x". Deterministic output. */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>

extern char **environ;

static int waited(int err, pid_t pid) {
    if (err != 0)
        return -err;
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return -1000;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
}

static int spawnp(char *file) {
    char *argv[] = {file, "x", NULL};
    pid_t pid = 0;
    int err = posix_spawnp(&pid, file, NULL, NULL, argv, environ);
    return waited(err, pid);
}

static int spawn_in(char *path, char *dir) {
    char *argv[] = {path, "x", NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (dir != NULL)
        posix_spawn_file_actions_addchdir_np(&fa, dir);
    pid_t pid = 0;
    int err = posix_spawn(&pid, path, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    return waited(err, pid);
}

int main(int argc, char **argv) {
    printf("spawnp true: %d\n", spawnp("true"));
    printf("spawnp missing: %d\n", spawnp("aetrace-no-such-program"));
    printf("spawn not executable: %d\n", spawn_in("/etc/passwd", NULL));
    printf("spawn ./true in /bin: %d\n", spawn_in("./true", "/bin"));
    if (argc > 1)
        printf("spawn script: %d\n", spawn_in(argv[1], NULL));
    return 0;
}
