/* search.h: `planc search` (search.c): the fastest plan that fits, by compiling candidates
 * through the pass driver and ranking them by explain's estimate. */
#ifndef PLANC_SEARCH_H
#define PLANC_SEARCH_H

#include "passes.h"

/* argv[0] is "search"; returns the exit status (0, 1 no plan or an input error, 2 usage) */
int search_main(int argc, char **argv);

#endif
