-- How a profile's text becomes lexical (BM25) terms (issue 35): 'wordpiece' (the model's word pieces plus CJK
-- unigrams and bigrams, what every profile did so far) or 'english' (whole words, English stop words out,
-- Snowball-stemmed, the same CJK n-grams); pipelines/domain/lexical.py. Every lexical row and statistic of a
-- profile depends on it, so it is set when the profile is created and never changed in place: a different
-- analyzer is a new profile, built, gated and activated (or rolled back) like any migration.
ALTER TABLE index_profile
    ADD COLUMN lexical_analyzer text NOT NULL DEFAULT 'wordpiece'
        CHECK (lexical_analyzer IN ('wordpiece', 'english'));

-- The analyzers a gate result scored the shadow and the baseline with (rows from before this migration: NULL,
-- they scored 'wordpiece').
ALTER TABLE profile_gate
    ADD COLUMN lexical_analyzer          text CHECK (lexical_analyzer IN ('wordpiece', 'english')),
    ADD COLUMN baseline_lexical_analyzer text CHECK (baseline_lexical_analyzer IN ('wordpiece', 'english'));
