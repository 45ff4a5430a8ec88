-- The default profile analyzes English as words (issue 35): stemmed, stop words out, the CJK n-grams kept
-- (pipelines/domain/lexical.py). On the pep-titles set it lifted lexical from 0.808 to 0.831 and hybrid from
-- 0.849 to 0.870 nDCG@10, within 0.005 of the word pieces on the xquad and cmrc2018 regression sets
-- (python -m bench.retrieval; README, "Search modes").
-- Only on an install that has not indexed anything under minilm-v1 yet: every lexical row depends on the
-- analyzer, so an install with rows keeps 'wordpiece' (switching it is a migration: kbindex profile create
-- NAME --analyzer english, backfill, gate, activate).
UPDATE index_profile
   SET lexical_analyzer = 'english'
 WHERE name = 'minilm-v1'
   AND lexical_analyzer = 'wordpiece'
   AND NOT EXISTS (SELECT 1 FROM index_task WHERE profile = 'minilm-v1')
   AND NOT EXISTS (SELECT 1 FROM chunk WHERE profile = 'minilm-v1')
   AND NOT EXISTS (SELECT 1 FROM lexical_chunk WHERE profile = 'minilm-v1');
