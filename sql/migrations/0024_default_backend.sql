-- The default profile embeds with the fastest local backend of the same quality (issue 15): MiniLM with
-- int8 MatMul weights on onnxruntime, 4x torch's chunks/s at nDCG@10 within 0.005 of torch on
-- eval/xquad-en (python -m bench.embed measures and recommends it). Built from the packaged model on
-- first use: nothing is downloaded.
-- Only on an install that has not indexed anything under minilm-v1 yet: an install with vectors keeps
-- them (switching its backend is a model migration: kbindex profile create, backfill, gate, activate).
UPDATE index_profile
   SET model = 'all-MiniLM-L6-v2-int8'
 WHERE name = 'minilm-v1'
   AND model = 'all-MiniLM-L6-v2'
   AND NOT EXISTS (SELECT 1 FROM index_task WHERE profile = 'minilm-v1')
   AND NOT EXISTS (SELECT 1 FROM chunk WHERE profile = 'minilm-v1');
