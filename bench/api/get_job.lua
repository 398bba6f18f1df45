-- wrk script: GET with the key in FUSEBOX_BENCH_KEY (bench/api/run.sh).
wrk.headers["Authorization"] = "Bearer " .. os.getenv("FUSEBOX_BENCH_KEY")
