"""The metric vocabulary of fusebox (docs/jobspec.md, "Metrics"), as data.

Every output of fusebox names its metrics with these words: fusebox-train's
JSON lines, the server's metric series and a job's latest_metrics, and the
"metrics" entry of model and checkpoint files.  The rest of this package
reads names from here only, so a change of vocabulary is a change of this
file.
"""

# measured on the step's training minibatch
LOSS = "loss"
ACCURACY = "accuracy"
TRAINING = (LOSS, ACCURACY)

# measured by the periodic evaluation, and the step it ran at
EVAL_LOSS = "eval_loss"
EVAL_ACCURACY = "eval_accuracy"
EVALUATION = (EVAL_LOSS, EVAL_ACCURACY)
EVAL_STEP = "eval_step"

# the per-step series of GET /v1/jobs/{id}/metrics
SERIES = TRAINING + EVALUATION + (
    "samples_per_s", "slowdown", "compute_ms", "comm_ms", "io_ms", "wait_ms")

# what a progress line shows, in order: the latest training loss, the latest evaluation
PROGRESS = (LOSS, EVAL_LOSS, EVAL_ACCURACY)
