package store

// migration3 (issue 21): event names starting with "pgsse:" are reserved (SPEC §2:
// pgsse:gap, pgsse:presence are pgsse's own). pgsse.check_args and pgsse.valid_names gain
// the rule; everything else in them is as in versions 1 and 2, so pgsse.publish,
// pgsse.broadcast and pgsse.publish_many refuse such names with SQLSTATE 22023 and keep
// their signatures, results and other messages.
const migration3 = `
CREATE OR REPLACE FUNCTION pgsse.check_args(stream text, data text, event text, audience text[])
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    tag text;
BEGIN
    IF stream IS NULL OR octet_length(stream) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'stream name must be 1-200 bytes',
            DETAIL = format('stream = %L (%s bytes)', left(stream, 64), octet_length(stream));
    END IF;
    IF stream COLLATE "C" !~ '^[A-Za-z0-9._:@/=+~-]+$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -',
            DETAIL = format('stream = %L', left(stream, 64));
    END IF;
    IF data IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'data must not be NULL';
    END IF;
    IF event IS NOT NULL THEN
        IF octet_length(event) NOT BETWEEN 1 AND 64 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'event name must be 1-64 bytes',
                DETAIL = format('event = %L (%s bytes); use NULL for the default "message"', left(event, 64), octet_length(event));
        END IF;
        IF event COLLATE "C" !~ '^[A-Za-z0-9._:-]+$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'event name may contain only A-Z a-z 0-9 and . _ : -',
                DETAIL = format('event = %L', left(event, 64));
        END IF;
        IF left(event, 6) = 'pgsse:' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'event names starting with pgsse: are reserved',
                DETAIL = format('event = %L; pgsse:gap and pgsse:presence are pgsse''s own events', left(event, 64));
        END IF;
    END IF;
    IF audience IS NOT NULL THEN
        IF array_ndims(audience) > 1 THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'audience must be a one-dimensional array';
        END IF;
        IF cardinality(audience) > 64 THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'audience must have at most 64 tags',
                DETAIL = format('%s tags', cardinality(audience));
        END IF;
        FOREACH tag IN ARRAY audience LOOP
            IF tag IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'audience tags must not be NULL';
            END IF;
            IF octet_length(tag) NOT BETWEEN 1 AND 200 THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'audience tag must be 1-200 bytes',
                    DETAIL = format('tag = %L (%s bytes)', left(tag, 64), octet_length(tag));
            END IF;
            IF tag ~ E'[\\x01-\\x1f\\x7f]' THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'audience tag must not contain control characters',
                    DETAIL = format('tag = %L', left(tag, 64));
            END IF;
        END LOOP;
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION pgsse.valid_names(stream text, event text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT octet_length(stream) BETWEEN 1 AND 200
       AND stream COLLATE "C" ~ '^[A-Za-z0-9._:@/=+~-]+$'
       AND (event IS NULL OR (octet_length(event) BETWEEN 1 AND 64
                              AND event COLLATE "C" ~ '^[A-Za-z0-9._:-]+$'
                              AND left(event, 6) <> 'pgsse:'))
$fn$;
`
