/* The library of stackview.c, traced with `--libs`. */
int stackview_lib_sum(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += i;
    return s;
}
