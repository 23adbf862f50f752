/* exec_lib's library, built by the test as libaeexec.so.1 and traced with
 * `--libs libaeexec.so.1`: one function, which the image that execs, the
 * image it exec'd, or both open with dlopen and call. */
int lib_counter;

int lib_work(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += (i % 3) ? i : -i;
    lib_counter += n;
    return s;
}
