-- wrk script: POST /v1/jobs with the spec in FUSEBOX_BENCH_SPEC and the key
-- in FUSEBOX_BENCH_KEY (bench/api/run.sh sets both).
local f = assert(io.open(os.getenv("FUSEBOX_BENCH_SPEC"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("FUSEBOX_BENCH_KEY")
