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

# measured by the validation (at each eval_every and at the end, on the validation set:
# the dataset's val split or records held out of train), and the step it ran at
VAL_LOSS = "val_loss"
VAL_ACCURACY = "val_accuracy"
VALIDATION = (VAL_LOSS, VAL_ACCURACY)
VAL_STEP = "val_step"

# measured once, at the end, on the test split: reported, never used to decide
TEST_LOSS = "test_loss"
TEST_ACCURACY = "test_accuracy"
TEST = (TEST_LOSS, TEST_ACCURACY)

# the per-step series of GET /v1/jobs/{id}/metrics
SERIES = TRAINING + VALIDATION + TEST + (
    "samples_per_s", "slowdown", "compute_ms", "comm_ms", "io_ms", "wait_ms")

# what a progress line shows, in order: the latest training loss, the latest validation, and
# the test accuracy once there is one
PROGRESS = (LOSS, VAL_LOSS, VAL_ACCURACY, TEST_ACCURACY)
