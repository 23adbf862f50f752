/* spawn_names: posix_spawn of a program (argv[2], its arguments after)
 * with file actions by argv[1]: "n" none (NULL), "c" a chdir to "/", an
 * open of /dev/null at descriptor 6 and a dup2 of 1 to 8, "f" an fchdir
 * to a close-on-exec descriptor of "/usr" and a close of descriptor 3,
 * "p" none through posix_spawnp. Descriptor 3, /dev/null, is inherited
 * unless closed. Prints the child's exit status; for the transparency
 * tests, whose child is traces/exename.c's program (its names, working
 * directory, descriptors and stack addresses must be the native run's). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char **argv) {
    if (argc < 3 || strlen(argv[1]) != 1 || !strchr("ncfp", argv[1][0])) {
        fprintf(stderr, "usage: spawn_names n|c|f|p PROGRAM [ARG...]\n");
        return 2;
    }
    if (open("/dev/null", O_RDONLY) != 3)
        return 3;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    char mode = argv[1][0];
    if (mode == 'c') {
        posix_spawn_file_actions_addchdir_np(&fa, "/");
        posix_spawn_file_actions_addopen(&fa, 6, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_adddup2(&fa, 1, 8);
    } else if (mode == 'f') {
        int usr = open("/usr", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        posix_spawn_file_actions_addfchdir_np(&fa, usr);
        posix_spawn_file_actions_addclose(&fa, 3);
    }
    posix_spawn_file_actions_t *actions = mode == 'c' || mode == 'f' ? &fa : NULL;
    fflush(stdout);
    pid_t pid;
    int err = mode == 'p' ? posix_spawnp(&pid, argv[2], actions, NULL, argv + 2, environ)
                          : posix_spawn(&pid, argv[2], actions, NULL, argv + 2, environ);
    if (err != 0) {
        printf("spawn: %s\n", strerror(err));
        return 1;
    }
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return 4;
    printf("child: %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status));
    return 0;
}
