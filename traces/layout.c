/* layout: prints where its heap and its stack are, or with the argument
 * "mmap" where its mappings go, for the transparency tests (issue 23):
 * with address randomisation off, a recorded run must print what the
 * native one prints. A program hashing its own pointers (Tcl's
 * TCL_ONE_WORD_KEYS tables, identity-keyed dictionaries, gcc's ggc page
 * table) takes the path these addresses give it. The heap is printed from
 * the page after the image (the kernel starts the break there), the stack
 * as the address of a local, the mappings as an anonymous mmap's address
 * and a large malloc block's (glibc maps it). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

extern char _end[];

static int mappings(void) {
    void *anon = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *big = malloc(4 << 20);
    if (anon == MAP_FAILED || big == NULL)
        return 1;
    printf("mmap at %p\n", anon);
    printf("large block at %p\n", (void *)big);
    free(big);
    return munmap(anon, 1 << 16) != 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "mmap") == 0)
        return mappings();
    uintptr_t image_end = ((uintptr_t)_end + 4095) & ~(uintptr_t)4095;
    char *block = malloc(32);
    char local;
    printf("heap at image end + %#lx\n", (unsigned long)((uintptr_t)block - image_end));
    printf("stack at %p\n", (void *)&local);
    free(block);
    return 0;
}
