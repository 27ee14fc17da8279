/* plan.h — `tetra plan`: look at a parallel layout before paying for a run.
 *
 *   tetra plan pp   build or load a pipeline schedule, simulate one step of it
 *                   with given action times, and print its timeline, bubble and
 *                   peak in-flight microbatches (optionally a CSV and a PNG chart)
 *
 * Exit status: 0, 1 for a schedule or file that cannot be used (deadlock, bad
 * CSV, write error), 2 for bad arguments.
 */
#ifndef TETRA_PLAN_H
#define TETRA_PLAN_H

/* argv[0] is "plan". */
int plan_main(int argc, char **argv);

#endif
