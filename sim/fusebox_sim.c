/*
 * fusebox-sim: runs a scenario (sim/README.md) through the server's planner,
 * scheduler and fair-share controller and prints what came out.
 *
 *   fusebox-sim [options] FILE...
 *
 * Files are read in order (later files may use names defined in earlier
 * ones).  Exit status: 0 done, 1 a run failed, 2 bad usage or scenario.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "errors.h"
#include "sim.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fusebox-sim [options] FILE...\n"
            "  --no-fusion      one model per array (max_b = 1)\n"
            "  --no-rebalance   no fair-share controller: planner splits and shares stay\n"
            "  --migrate        act on the controller's migration suggestions\n"
            "  --no-migrate     ignore them\n"
            "  --compare        run four variants (fusion off/on x rebalance off/on) side by side\n"
            "  --scale F        shrink devices, generated jobs and their rate by F in (0, 1]\n"
            "  --json           print JSON instead of a table\n"
            "  --jobs           also print one line per job (single runs only)\n"
            "  --version        print the version and exit\n"
            "  -h, --help       this text\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    bool compare = false, json = false, per_job = false, no_fusion = false, no_rebalance = false;
    int migrate = -1;
    double scale = 1.0;
    int first_file = argc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--compare") == 0) {
            compare = true;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--jobs") == 0) {
            per_job = true;
        } else if (strcmp(a, "--no-fusion") == 0) {
            no_fusion = true;
        } else if (strcmp(a, "--no-rebalance") == 0) {
            no_rebalance = true;
        } else if (strcmp(a, "--migrate") == 0) {
            migrate = 1;
        } else if (strcmp(a, "--no-migrate") == 0) {
            migrate = 0;
        } else if (strcmp(a, "--scale") == 0) {
            if (i + 1 == argc) {
                fprintf(stderr, "fusebox-sim: --scale needs a value\n");
                return 2;
            }
            char *end;
            scale = strtod(argv[++i], &end);
            if (*end || !(scale > 0.0 && scale <= 1.0)) {
                fprintf(stderr, "fusebox-sim: --scale %s is not a number in (0, 1]\n", argv[i]);
                return 2;
            }
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("fusebox-sim %s\n", FB_VERSION_STRING);
            return 0;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "fusebox-sim: unknown option %s\n", a);
            usage(stderr);
            return 2;
        } else {
            first_file = i;
            break;
        }
    }
    if (first_file >= argc) {
        usage(stderr);
        return 2;
    }
    for (int i = first_file; i < argc; i++)
        if (argv[i][0] == '-') {
            fprintf(stderr, "fusebox-sim: options go before the files (%s)\n", argv[i]);
            return 2;
        }
    if (compare && (no_fusion || no_rebalance)) {
        fprintf(stderr,
                "fusebox-sim: --compare runs every variant; drop --no-fusion/--no-rebalance\n");
        return 2;
    }

    sim_scenario sc = {0};
    char msg[512];
    int rc = 0;
    for (int i = first_file; i < argc && !rc; i++)
        rc = sim_scenario_read(&sc, argv[i], msg, sizeof msg);
    if (!rc) rc = sim_scenario_finish(&sc, scale, msg, sizeof msg);
    if (rc) {
        fprintf(stderr, "fusebox-sim: %s\n", msg);
        sim_scenario_free(&sc);
        return 2;
    }
    sim_config base = sc.cfg;
    if (migrate >= 0) base.migrate = migrate == 1;

    enum { MAXV = 4 };
    sim_config cfg[MAXV];
    const char *label[MAXV];
    int nv = 0;
    if (compare) {
        /* the baseline first: every ratio is to it */
        static const char *names[MAXV] = {"baseline", "+fusion", "+rebalance", "fusebox"};
        for (int k = 0; k < MAXV; k++) {
            cfg[k] = base;
            cfg[k].max_b = (k & 1) ? base.max_b : 1;
            cfg[k].rebalance = (k & 2) != 0;
            label[k] = names[k];
        }
        nv = MAXV;
    } else {
        cfg[0] = base;
        if (no_fusion) cfg[0].max_b = 1;
        if (no_rebalance) cfg[0].rebalance = false;
        label[0] = no_fusion && no_rebalance ? "baseline"
                   : no_fusion               ? "no-fusion"
                   : no_rebalance            ? "no-rebalance"
                                             : "fusebox";
        nv = 1;
    }
    sim_result res[MAXV];
    sim_variant v[MAXV];
    memset(res, 0, sizeof res);
    int done = 0;
    for (int k = 0; k < nv; k++) {
        double t0 = now_s();
        if (sim_run(&sc, &cfg[k], &res[k], msg, sizeof msg)) {
            fprintf(stderr, "fusebox-sim: %s: %s\n", label[k], msg);
            rc = 1;
            break;
        }
        v[k] = (sim_variant){.label = label[k], .r = &res[k], .wall_s = now_s() - t0};
        done++;
    }
    if (!rc) {
        if (json)
            sim_report_json(stdout, &sc, v, nv);
        else
            sim_report_table(stdout, &sc, v, nv);
        if (per_job && nv == 1) sim_report_jobs(stdout, &sc, &res[0]);
    }
    for (int k = 0; k < done; k++)
        sim_result_free(&res[k]);
    sim_scenario_free(&sc);
    return rc;
}
