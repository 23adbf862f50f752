/* layout: prints where its heap and its stack are, for the transparency
 * tests (issue 23): with address randomisation off, a recorded run must
 * print what the native one prints. A program hashing its own pointers
 * (Tcl's TCL_ONE_WORD_KEYS tables, identity-keyed dictionaries) takes the
 * path these addresses give it. The heap is printed from the page after
 * the image (the kernel starts the break there), the stack as the
 * address of a local. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern char _end[];

int main(void) {
    uintptr_t image_end = ((uintptr_t)_end + 4095) & ~(uintptr_t)4095;
    char *block = malloc(32);
    char local;
    printf("heap at image end + %#lx\n", (unsigned long)((uintptr_t)block - image_end));
    printf("stack at %p\n", (void *)&local);
    free(block);
    return 0;
}
