-- 011_validation: one vocabulary for evaluations.  A job now validates during
-- training on a validation set (the dataset's val split, or records held out
-- of train by the spec's val_fraction): val_loss and val_accuracy at each
-- eval_every and at its end.  It evaluates the test split once, at its end:
-- test_loss and test_accuracy, reported and never used to decide.
--
-- Before this migration every evaluation ran on the test split and was
-- stored as eval_loss and eval_accuracy, so those values are test values:
-- they become test_loss and test_accuracy (series, latest_metrics, the
-- 'completed' events).  The metric a sweep decides on can be no test metric:
-- a sweep that named eval_loss or eval_accuracy (its ASHA rule and the metric
-- that picks its best trial) names val_loss or val_accuracy from now on.
ALTER TABLE job_metrics RENAME COLUMN eval_loss TO test_loss;
ALTER TABLE job_metrics RENAME COLUMN eval_accuracy TO test_accuracy;
ALTER TABLE job_metrics ADD COLUMN val_loss double precision,
                        ADD COLUMN val_accuracy double precision;

UPDATE jobs SET latest_metrics = (latest_metrics - 'eval_loss' - 'eval_accuracy' - 'eval_step')
    || jsonb_strip_nulls(jsonb_build_object('test_loss', latest_metrics -> 'eval_loss',
                                            'test_accuracy', latest_metrics -> 'eval_accuracy'))
    WHERE latest_metrics ?| ARRAY['eval_loss', 'eval_accuracy', 'eval_step'];

UPDATE job_events SET data = (data - 'eval_loss' - 'eval_accuracy')
    || jsonb_strip_nulls(jsonb_build_object('test_loss', data -> 'eval_loss',
                                            'test_accuracy', data -> 'eval_accuracy'))
    WHERE data ?| ARRAY['eval_loss', 'eval_accuracy'];

UPDATE sweeps SET metric = CASE metric WHEN 'eval_loss' THEN 'val_loss' ELSE 'val_accuracy' END
    WHERE metric IN ('eval_loss', 'eval_accuracy');
UPDATE sweeps SET spec = jsonb_set(spec, '{early_stopping,metric}',
    to_jsonb(CASE spec #>> '{early_stopping,metric}' WHEN 'eval_loss' THEN 'val_loss'
             ELSE 'val_accuracy' END))
    WHERE spec #>> '{early_stopping,metric}' IN ('eval_loss', 'eval_accuracy');

-- A job accepted before validation existed and not yet ended resumes as it was
-- submitted: nothing held out of its training data (val_fraction 0, which
-- leaves its fusion key, and so its checkpoints, as they are).  New jobs get
-- the default of 0.1.
UPDATE jobs SET spec = spec || '{"val_fraction": 0}'
    WHERE state IN ('queued', 'scheduled', 'running') AND NOT spec ? 'val_fraction';
