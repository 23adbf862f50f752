/* The library of libmap.c: where its code and its data are. */
static int counter;

void *libmap_lib_code(void) { return (void *)libmap_lib_code; }

void *libmap_lib_data(void) { return &counter; }
