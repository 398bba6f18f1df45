-- 005_profile_warm: whether an isolated-step-time profile was measured on a
-- warm array.  An array's first progress report includes its warm-up (memory
-- first touched, threads started) and a member's last one its final
-- evaluation and export; such a report may only seed a profile that does not
-- exist yet (warm = false), and the first warm measurement replaces the seed
-- instead of being averaged with it.  Existing profiles count as warm.

ALTER TABLE profiles ADD COLUMN warm boolean NOT NULL DEFAULT true;
