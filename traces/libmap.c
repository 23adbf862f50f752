/* libmap: prints where its library's code and data, libc's code and a
 * later anonymous mmap are, for the transparency test of `record --libs`
 * (issue 23): with address randomisation off, a recorded run whose
 * library is the rewritten copy must print what the native one prints. Tcl
 * hashes such addresses (its TCL_ONE_WORD_KEYS tables), so `tclsh` with
 * `--libs libtcl8.6.so` takes another path when they move (docs/sweep.md). */
#include <stdio.h>
#include <sys/mman.h>

void *libmap_lib_code(void);
void *libmap_lib_data(void);

int main(void) {
    void *anon = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (anon == MAP_FAILED)
        return 1;
    printf("library code at %p\n", libmap_lib_code());
    printf("library data at %p\n", libmap_lib_data());
    printf("libc's printf at %p\n", (void *)printf);
    printf("mmap at %p\n", anon);
    return munmap(anon, 1 << 16) != 0;
}
