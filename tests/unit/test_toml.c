/* test_toml.c — unit tests of the TOML parser (config/toml.h).
 *
 * Plain main(): every check prints one line; the exit status is the number of
 * failed checks (capped), so ctest reports any failure.
 */
#include "config/toml.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int n_checks, n_failed;

static void check(int ok, int line, const char *fmt, ...) {
    va_list ap;
    n_checks++;
    if (!ok) n_failed++;
    printf("%s %d (line %d) - ", ok ? "ok  " : "FAIL", n_checks, line);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

#define CHECK(cond, ...) check((cond) ? 1 : 0, __LINE__, __VA_ARGS__)

static char last_err[512];

/* Parse a document that must be valid; reports the error otherwise. */
static toml_value *parse_n(const char *doc, size_t len, int line) {
    toml_value *v = toml_parse(doc, len, last_err, sizeof last_err);
    if (!v) check(0, line, "expected valid document, got error: %s", last_err);
    return v;
}
#define PARSE(doc) parse_n((doc), strlen(doc), __LINE__)

/* The document must be rejected with an error at the given "L:C" containing
 * the given text. */
static void expect_err_n(const char *doc, size_t len, const char *where, const char *text, int line) {
    char pre[32];
    toml_value *v = toml_parse(doc, len, last_err, sizeof last_err);
    if (v) {
        toml_free(v);
        check(0, line, "expected error '%s: ...%s...' but the document was accepted", where, text);
        return;
    }
    /* where is "L:C" for an exact position, "L" for a line, "" for anywhere;
     * the message must always start with "L:C: ". */
    snprintf(pre, sizeof pre, strchr(where, ':') ? "%s: " : *where ? "%s:" : "%s", where);
    const char *q = last_err;
    int digits1 = 0, digits2 = 0;
    while (*q >= '0' && *q <= '9') q++, digits1++;
    if (*q == ':')
        for (q++; *q >= '0' && *q <= '9'; q++) digits2++;
    int shaped = digits1 && digits2 && q[0] == ':' && q[1] == ' ';
    int ok = shaped && strncmp(last_err, pre, strlen(pre)) == 0 && strstr(last_err, text) != NULL;
    check(ok, line, "error '%s' (want '%s: ...%s...')", last_err, where, text);
}
#define EXPECT_ERR(doc, where, text) expect_err_n((doc), strlen(doc), (where), (text), __LINE__)
#define EXPECT_ERR_N(doc, where, text) expect_err_n((doc), sizeof(doc) - 1, (where), (text), __LINE__)

/* Walk a dotted path of bare keys ("a.b.c"); array elements as "[N]" parts are not needed here. */
static const toml_value *get(const toml_value *root, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const toml_value *v = root;
    for (char *save = NULL, *part = strtok_r(buf, ".", &save); part && v; part = strtok_r(NULL, ".", &save))
        v = toml_table_get(v, part);
    return v;
}

static int is_int(const toml_value *v, int64_t want) { return v && v->type == TOML_INTEGER && v->u.i == want; }

static int is_float(const toml_value *v, double want) { return v && v->type == TOML_FLOAT && v->u.f == want; }

static int is_str(const toml_value *v, const char *want, size_t len) {
    return v && v->type == TOML_STRING && v->u.s.len == len && memcmp(v->u.s.ptr, want, len) == 0 &&
        v->u.s.ptr[len] == '\0';
}
#define IS_STR(v, lit) is_str((v), (lit), sizeof(lit) - 1)

static int is_dt(const toml_value *v, toml_type t, const char *text) {
    return v && v->type == t && strcmp(v->u.dt.text, text) == 0;
}

/* ------------------------------------------------------------------------ */

static void test_positions(void) {
    const char *doc = "a = 1\n"
                      "  [tbl]\n"
                      "  bb   =   'x'\n"
                      "\n"
                      "[[arr]]\n"
                      "[x.y]\n"
                      "[x]\n";
    toml_value *r = PARSE(doc);
    if (!r) return;
    const toml_entry *a = toml_table_find(r, "a");
    CHECK(a && a->line == 1 && a->col == 1, "key 'a' at 1:1");
    CHECK(a && a->value->line == 1 && a->value->col == 5, "value of 'a' at 1:5");
    const toml_entry *t = toml_table_find(r, "tbl");
    CHECK(t && t->line == 2 && t->col == 4, "key 'tbl' at 2:4 (inside the header)");
    CHECK(t && t->value->line == 2 && t->value->col == 3, "table [tbl] starts at its '[' (2:3)");
    const toml_entry *bb = toml_table_find(t ? t->value : NULL, "bb");
    CHECK(bb && bb->line == 3 && bb->col == 3, "key 'bb' at 3:3");
    CHECK(bb && bb->value->line == 3 && bb->value->col == 12, "value of 'bb' at 3:12");
    const toml_value *arr = toml_table_get(r, "arr");
    CHECK(arr && arr->line == 5 && arr->col == 1, "array of tables at 5:1");
    const toml_value *el = toml_array_get(arr, 0);
    CHECK(el && el->line == 5 && el->col == 1, "its first element at 5:1");
    /* [x] was implicit (from [x.y]) until line 7 defines it: positions follow the definition. */
    const toml_entry *x = toml_table_find(r, "x");
    CHECK(x && x->line == 7 && x->col == 2 && x->value->line == 7 && x->value->col == 1,
          "implicit table [x] takes the position of its later definition (7:1)");
    toml_free(r);

    r = PARSE("\xEF\xBB\xBFk = 1");
    const toml_entry *k = toml_table_find(r, "k");
    CHECK(k && k->line == 1 && k->col == 1, "columns after a BOM count from the first character");
    toml_free(r);

    r = PARSE("a = \"\"\"\nx\ny\"\"\"\nb = 2\r\nc = 3");
    const toml_entry *c = toml_table_find(r, "c");
    CHECK(c && c->line == 5 && c->col == 1, "line count includes lines inside strings and CRLF lines");
    toml_free(r);
}

static void test_types(void) {
    const char *doc = "s = \"str\"\n"
                      "i = 42\n"
                      "f = 3.25\n"
                      "b = true\n"
                      "odt = 1979-05-27T07:32:00Z\n"
                      "ldt = 1979-05-27T07:32:00\n"
                      "ld = 1979-05-27\n"
                      "lt = 07:32:00\n"
                      "arr = [1, 2]\n"
                      "tab = {k = 'v'}\n"
                      "no = false\n";
    toml_value *r = PARSE(doc);
    if (!r) return;
    CHECK(r->type == TOML_TABLE && r->u.tab.n == 11, "root is a table of 11 entries");
    static const struct {
        const char *key;
        toml_type type;
        const char *name;
    } want[] = {
        {"s", TOML_STRING, "string"},
        {"i", TOML_INTEGER, "integer"},
        {"f", TOML_FLOAT, "float"},
        {"b", TOML_BOOLEAN, "bool"},
        {"odt", TOML_OFFSET_DATETIME, "datetime"},
        {"ldt", TOML_LOCAL_DATETIME, "datetime-local"},
        {"ld", TOML_LOCAL_DATE, "date-local"},
        {"lt", TOML_LOCAL_TIME, "time-local"},
        {"arr", TOML_ARRAY, "array"},
        {"tab", TOML_TABLE, "table"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const toml_value *v = toml_table_get(r, want[i].key);
        CHECK(v && v->type == want[i].type && strcmp(toml_type_name(v->type), want[i].name) == 0, "'%s' is a %s",
              want[i].key, want[i].name);
    }
    CHECK(IS_STR(get(r, "s"), "str"), "string value");
    CHECK(is_int(get(r, "i"), 42), "integer value");
    CHECK(is_float(get(r, "f"), 3.25), "float value");
    CHECK(get(r, "b") && get(r, "b")->u.b == 1 && get(r, "no") && get(r, "no")->u.b == 0, "boolean values");
    CHECK(IS_STR(get(r, "tab.k"), "v"), "inline table value");
    CHECK(toml_array_len(get(r, "arr")) == 2 && is_int(toml_array_get(get(r, "arr"), 1), 2), "array accessors");
    CHECK(toml_array_get(get(r, "arr"), 2) == NULL && toml_array_len(get(r, "s")) == 0,
          "array accessors are safe out of range and on non-arrays");
    CHECK(toml_table_get(r, "missing") == NULL && toml_table_get(get(r, "i"), "x") == NULL &&
              toml_table_get(NULL, "x") == NULL,
          "lookups of absent keys and on non-tables return NULL");
    toml_free(r);

    r = PARSE("");
    CHECK(r && r->type == TOML_TABLE && r->u.tab.n == 0, "empty document is an empty table");
    toml_free(r);
    r = PARSE("# only a comment\n\n   \t\n");
    CHECK(r && r->u.tab.n == 0, "comments and blank lines only");
    toml_free(r);
    toml_free(NULL);
    CHECK(1, "toml_free(NULL) is harmless");
}

static void test_integers(void) {
    toml_value *r = PARSE("max = 9223372036854775807\n"
                          "min = -9223372036854775808\n"
                          "plus = +17\n"
                          "zero = 0\n"
                          "pzero = +0\n"
                          "nzero = -0\n"
                          "us = 1_000_000\n"
                          "hex = 0xDEAD_beef\n"
                          "hexmax = 0x7FFFFFFFFFFFFFFF\n"
                          "oct = 0o755\n"
                          "bin = 0b1101_0110\n"
                          "hexzero = 0x0000\n"
                          "octlead = 0o0017\n");
    if (r) {
        CHECK(is_int(get(r, "max"), INT64_MAX), "9223372036854775807 accepted");
        CHECK(is_int(get(r, "min"), INT64_MIN), "-9223372036854775808 accepted");
        CHECK(is_int(get(r, "plus"), 17), "+17");
        CHECK(is_int(get(r, "zero"), 0) && is_int(get(r, "pzero"), 0) && is_int(get(r, "nzero"), 0), "0, +0, -0");
        CHECK(is_int(get(r, "us"), 1000000), "underscores between digits");
        CHECK(is_int(get(r, "hex"), 0xDEADBEEF), "hex with mixed case and underscore");
        CHECK(is_int(get(r, "hexmax"), INT64_MAX), "largest hex");
        CHECK(is_int(get(r, "oct"), 0755), "octal");
        CHECK(is_int(get(r, "bin"), 0xD6), "binary");
        CHECK(is_int(get(r, "hexzero"), 0) && is_int(get(r, "octlead"), 017),
              "leading zeros are fine after a base prefix");
        toml_free(r);
    }
    EXPECT_ERR("a = 9223372036854775808", "1:5", "out of range");
    EXPECT_ERR("a = -9223372036854775809", "1:5", "out of range");
    EXPECT_ERR("a = 99999999999999999999999", "1:5", "out of range");
    EXPECT_ERR("a = 0x8000000000000000", "1:5", "out of range");
    EXPECT_ERR("a = 0xFFFFFFFFFFFFFFFFFF", "1:5", "out of range");
    EXPECT_ERR("a = 0b1000000000000000000000000000000000000000000000000000000000000000", "1:5", "out of range");
    EXPECT_ERR("a = +0x10", "1:5", "cannot have a sign");
    EXPECT_ERR("a = -0o10", "1:5", "cannot have a sign");
    EXPECT_ERR("a = 0X10", "1:6", "lowercase");
    EXPECT_ERR("a = 0x", "1:7", "hexadecimal digit");
    EXPECT_ERR("a = 0o8", "1:7", "octal digit");
    EXPECT_ERR("a = 0b102", "1:9", "invalid binary digit '2'");
    EXPECT_ERR("a = 0xg", "1:7", "hexadecimal digit");
    EXPECT_ERR("a = 01", "1:5", "leading zeros");
    EXPECT_ERR("a = -01", "1:6", "leading zeros");
    EXPECT_ERR("a = 0_1", "1:5", "leading zeros");
    EXPECT_ERR("a = 1__0", "1:6", "'_' in a number must be between two digits");
    EXPECT_ERR("a = 1_", "1:6", "between two digits");
    EXPECT_ERR("a = _1", "1:5", "invalid value '_1'");
    EXPECT_ERR("a = 0x_1", "1:7", "hexadecimal digit");
    EXPECT_ERR("a = 0x1_", "1:8", "between two digits");
    EXPECT_ERR("a = +_1", "1:6", "between two digits");
    EXPECT_ERR("a = ++1", "1:6", "expected a digit");
    EXPECT_ERR("a = 1 2", "1:7", "expected end of line after the value");
    EXPECT_ERR("a = 12a", "1:7", "invalid character 'a' in number");
}

static void test_floats(void) {
    toml_value *r = PARSE("a = 1.5\n"
                          "b = -2e-3\n"
                          "c = 6.626e-34\n"
                          "d = 1E6\n"
                          "e = 1e+06\n"
                          "f = 3.141_592_6\n"
                          "g = 1_000.5e1_0\n"
                          "pinf = inf\n"
                          "pinf2 = +inf\n"
                          "ninf = -inf\n"
                          "nan1 = nan\n"
                          "nan2 = +nan\n"
                          "nan3 = -nan\n"
                          "nz = -0.0\n"
                          "pz = +0.0\n"
                          "ze = 0e0\n"
                          "tiny = 1e-400\n"
                          "big = 1.7976931348623157e308\n");
    if (r) {
        CHECK(is_float(get(r, "a"), 1.5), "1.5");
        CHECK(is_float(get(r, "b"), -2e-3), "-2e-3");
        CHECK(is_float(get(r, "c"), 6.626e-34), "6.626e-34");
        CHECK(is_float(get(r, "d"), 1e6) && is_float(get(r, "e"), 1e6), "1E6 and exponent with leading zero");
        CHECK(is_float(get(r, "f"), 3.1415926), "underscores in the fraction");
        CHECK(is_float(get(r, "g"), 1000.5e10), "underscores in the integer part and exponent");
        CHECK(is_float(get(r, "pinf"), INFINITY) && is_float(get(r, "pinf2"), INFINITY), "inf, +inf");
        CHECK(is_float(get(r, "ninf"), -INFINITY), "-inf");
        CHECK(get(r, "nan1") && isnan(get(r, "nan1")->u.f) && !signbit(get(r, "nan1")->u.f), "nan");
        CHECK(get(r, "nan2") && isnan(get(r, "nan2")->u.f), "+nan");
        CHECK(get(r, "nan3") && isnan(get(r, "nan3")->u.f) && signbit(get(r, "nan3")->u.f), "-nan keeps its sign");
        CHECK(is_float(get(r, "nz"), 0.0) && signbit(get(r, "nz")->u.f), "-0.0 is negative zero");
        CHECK(is_float(get(r, "pz"), 0.0) && !signbit(get(r, "pz")->u.f), "+0.0");
        CHECK(is_float(get(r, "ze"), 0.0), "0e0 is a float");
        CHECK(is_float(get(r, "tiny"), 0.0), "underflow rounds to zero");
        CHECK(is_float(get(r, "big"), 1.7976931348623157e308), "largest double");
        toml_free(r);
    }
    EXPECT_ERR("a = 1e400", "1:5", "out of range");
    EXPECT_ERR("a = 1.", "1:7", "expected a digit after the decimal point");
    EXPECT_ERR("a = .5", "1:5", "digit before the decimal point");
    EXPECT_ERR("a = -.5", "1:6", "digit before the decimal point");
    EXPECT_ERR("a = 1.e5", "1:7", "after the decimal point");
    EXPECT_ERR("a = 1e", "1:7", "exponent");
    EXPECT_ERR("a = 1e5.5", "1:8", "at most one decimal point");
    EXPECT_ERR("a = 1.2.3", "1:8", "at most one decimal point");
    EXPECT_ERR("a = 01.5", "1:5", "leading zeros");
    EXPECT_ERR("a = 1_.5", "1:6", "between two digits");
    EXPECT_ERR("a = 1._5", "1:7", "after the decimal point");
    EXPECT_ERR("a = 1.5_", "1:8", "between two digits");
    EXPECT_ERR("a = 1e_5", "1:7", "exponent");
    EXPECT_ERR("a = infinity", "1:5", "invalid value 'infinity'");
    EXPECT_ERR("a = Inf", "1:5", "lowercase");
    EXPECT_ERR("a = NaN", "1:5", "lowercase");
    EXPECT_ERR("a = +in", "1:6", "expected a digit");
    EXPECT_ERR("a = nan_", "1:5", "invalid value");
}

static void test_format_float(void) {
    static const struct {
        double v;
        const char *text;
    } cases[] = {
        {0.1, "0.1"},
        {1.0, "1.0"},
        {-2.5, "-2.5"},
        {0.0, "0.0"},
        {1e300, "1e+300"},
        {3e-4, "0.0003"},
        {1e16, "1e+16"},
        {123456789.0, "123456789.0"},
        {100.0, "100.0"},
        {1e15, "1000000000000000.0"},
        {2.5e-5, "2.5e-05"},
        {3e-4, "0.0003"},
        {1234.5, "1234.5"},
        {-7e3, "-7000.0"},
        {0.001, "0.001"},
        {6e-5, "6e-05"},
        {1.5e10, "15000000000.0"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        toml_format_float(cases[i].v, buf, sizeof buf);
        CHECK(strcmp(buf, cases[i].text) == 0, "toml_format_float(%.17g) = '%s' (want '%s')", cases[i].v, buf,
              cases[i].text);
    }
    toml_format_float(-0.0, buf, sizeof buf);
    CHECK(strcmp(buf, "-0.0") == 0, "negative zero renders as -0.0 (got '%s')", buf);
    toml_format_float(INFINITY, buf, sizeof buf);
    CHECK(strcmp(buf, "inf") == 0, "inf");
    toml_format_float(-INFINITY, buf, sizeof buf);
    CHECK(strcmp(buf, "-inf") == 0, "-inf");
    toml_format_float(NAN, buf, sizeof buf);
    CHECK(strcmp(buf, "nan") == 0, "nan");

    /* Every rendering must parse back to the same double. */
    static const double rt[] = {0.1,         1.0 / 3,
                                2.0 / 3,     1e-320,
                                5e-324,      1.7976931348623157e308,
                                123.456e-78, -9007199254740993.0,
                                1e23,        0.30000000000000004};
    int all = 1;
    for (size_t i = 0; i < sizeof rt / sizeof rt[0]; i++) {
        char doc[96];
        toml_format_float(rt[i], buf, sizeof buf);
        snprintf(doc, sizeof doc, "x = %s", buf);
        toml_value *r = toml_parse(doc, strlen(doc), last_err, sizeof last_err);
        if (!r || !is_float(get(r, "x"), rt[i])) {
            all = 0;
            printf("    round trip of %.17g via '%s' failed: %s\n", rt[i], buf, r ? "value differs" : last_err);
        }
        toml_free(r);
    }
    CHECK(all, "toml_format_float output parses back exactly");
}

static void test_strings(void) {
    toml_value *r = PARSE("esc = \"b\\bt\\tn\\nf\\fr\\rq\\\"bs\\\\\"\n"
                          "u4 = \"\\u00E9\\u20AC\"\n"
                          "u8 = \"\\U0001F600\\U0010FFFF\"\n"
                          "nul = \"a\\u0000b\"\n"
                          "tab = \"a\tb\"\n"
                          "utf = \"h\xC3\xA9llo \xE2\x82\xAC\"\n"
                          "lit = 'C:\\Users\\nodejs\\templates'\n"
                          "litq = '<\\i\\c*\\s*>'\n"
                          "empty = \"\"\n"
                          "emptylit = ''\n"
                          "ml = \"\"\"\nRoses are red\nViolets are blue\"\"\"\n"
                          "ml2 = \"\"\"one\\\n    two \\\n\n   three\"\"\"\n"
                          "ml3 = \"\"\"\\\n  \"\"\"\n"
                          "mlq = \"\"\"a \"quoted\" \"\"word\"\" here\"\"\"\"\"\n"
                          "mllit = '''\nfirst\n  second \\n'''\n"
                          "mllitq = ''''one' ''two'''''\n"
                          "mlws = \"\"\"x\\ \t \n  y\"\"\"\n"
                          "mlesc = \"\"\"\\\"\\\"\\\"\"\"\"\n"
                          "hash = \"# not a comment\" # a comment\n");
    if (r) {
        CHECK(IS_STR(get(r, "esc"), "b\bt\tn\nf\fr\rq\"bs\\"), "all single-character escapes");
        CHECK(IS_STR(get(r, "u4"), "\xC3\xA9\xE2\x82\xAC"), "\\u escapes become UTF-8");
        CHECK(IS_STR(get(r, "u8"), "\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF"), "\\U escapes up to U+10FFFF");
        CHECK(IS_STR(get(r, "nul"), "a\0b"), "\\u0000 is kept, with an explicit length");
        CHECK(IS_STR(get(r, "tab"), "a\tb"), "a raw tab is allowed in a basic string");
        CHECK(IS_STR(get(r, "utf"), "h\xC3\xA9llo \xE2\x82\xAC"), "UTF-8 text is kept as-is");
        CHECK(IS_STR(get(r, "lit"), "C:\\Users\\nodejs\\templates"), "literal string keeps backslashes");
        CHECK(IS_STR(get(r, "litq"), "<\\i\\c*\\s*>"), "literal string with regex");
        CHECK(IS_STR(get(r, "empty"), "") && IS_STR(get(r, "emptylit"), ""), "empty strings");
        CHECK(IS_STR(get(r, "ml"), "Roses are red\nViolets are blue"),
              "multi-line: the newline after the opening quotes is dropped");
        CHECK(IS_STR(get(r, "ml2"), "onetwo three"), "line-ending backslash trims newlines and indentation");
        CHECK(IS_STR(get(r, "ml3"), ""), "line-ending backslash right after the opening quotes");
        CHECK(IS_STR(get(r, "mlq"), "a \"quoted\" \"\"word\"\" here\"\""),
              "one or two quotes inside and before the closing delimiter");
        CHECK(IS_STR(get(r, "mllit"), "first\n  second \\n"), "multi-line literal");
        CHECK(IS_STR(get(r, "mllitq"), "'one' ''two''"), "quotes inside a multi-line literal");
        CHECK(IS_STR(get(r, "mlws"), "xy"), "whitespace between the backslash and the newline");
        CHECK(IS_STR(get(r, "mlesc"), "\"\"\""), "escaped quotes in a multi-line string");
        CHECK(IS_STR(get(r, "hash"), "# not a comment"), "'#' inside a string");
        toml_free(r);
    }
    EXPECT_ERR("a = \"\\x41\"", "1:6", "invalid escape sequence: backslash followed by 'x'");
    EXPECT_ERR("a = \"\\e\"", "1:6", "backslash followed by 'e'");
    EXPECT_ERR("a = \"\\/\"", "1:6", "invalid escape");
    EXPECT_ERR("a = \"\\ \"", "1:6", "backslash followed by a space");
    EXPECT_ERR("a = \"\\uD800\"", "1:6", "surrogate");
    EXPECT_ERR("a = \"\\uDFFF\"", "1:6", "surrogate");
    EXPECT_ERR("a = \"\\U0000D800\"", "1:6", "surrogate");
    EXPECT_ERR("a = \"\\U00110000\"", "1:6", "beyond the last Unicode code point");
    EXPECT_ERR("a = \"\\u12\"", "1:10", "expected 4 hexadecimal digits");
    EXPECT_ERR("a = \"\\U1234567\"", "1:15", "expected 8 hexadecimal digits");
    EXPECT_ERR("a = \"abc", "1:9", "unterminated string opened at 1:5");
    EXPECT_ERR("a = \"abc\nb = 1", "1:9", "string opened at 1:5");
    EXPECT_ERR("a = 'abc\n", "1:9", "not closed");
    EXPECT_ERR("a = \"\"\"abc", "1:11", "unterminated multi-line string: opened at 1:5");
    EXPECT_ERR("a = '''abc\n", "2:1", "unterminated multi-line string");
    EXPECT_ERR("a = \"\"\"x\"\"\"\"\"\"", "1:14", "too many quotes");
    EXPECT_ERR("a = \"\"\"x\\ y\"\"\"", "1:9", "line-ending backslash");
    EXPECT_ERR("a = \"a\" \"b\"", "1:9", "expected end of line after the value");
    EXPECT_ERR("a = \"\\", "1:6", "unterminated string");
    EXPECT_ERR("a = '''\\'''x'''", "1:12", "expected end of line");
}

static void test_keys(void) {
    toml_value *r = PARSE("a.b.c = 1\n"
                          "a.b.d = 2\n"
                          "a . e = 3\n"
                          "\"quoted.key\" = 4\n"
                          "'lit key' = 5\n"
                          "\"\" = 6\n"
                          "site.\"google.com\" = true\n"
                          "1234 = 7\n"
                          "3.14 = 8\n"
                          "-_- = 9\n"
                          "\"\\u00e9\" = 10\n"
                          "true = 11\n");
    if (r) {
        CHECK(is_int(get(r, "a.b.c"), 1) && is_int(get(r, "a.b.d"), 2), "dotted keys share parent tables");
        CHECK(is_int(get(r, "a.e"), 3), "whitespace around the dot");
        CHECK(is_int(toml_table_get(r, "quoted.key"), 4), "a quoted key with a dot is one key");
        CHECK(is_int(toml_table_get(r, "lit key"), 5), "a literal-string key");
        const toml_entry *e = NULL;
        for (size_t i = 0; i < r->u.tab.n; i++)
            if (r->u.tab.entries[i].key_len == 0 && r->u.tab.entries[i].value->type == TOML_INTEGER)
                e = &r->u.tab.entries[i];
        CHECK(e && is_int(e->value, 6), "the empty quoted key \"\"");
        CHECK(get(r, "site") && toml_table_get(get(r, "site"), "google.com"), "quoted part of a dotted key");
        CHECK(is_int(toml_table_get(r, "1234"), 7), "numeric bare key");
        CHECK(is_int(get(r, "3.14"), 8) && is_int(toml_table_get(toml_table_get(r, "3"), "14"), 8),
              "3.14 as a key is the dotted key 3 -> 14");
        CHECK(is_int(toml_table_get(r, "-_-"), 9), "bare key of '-' and '_'");
        CHECK(is_int(toml_table_get(r, "\xC3\xA9"), 10), "escapes in quoted keys are decoded");
        CHECK(is_int(toml_table_get(r, "true"), 11), "'true' is a valid bare key");
        CHECK(r->u.tab.n > 0 && r->u.tab.entries[0].key[r->u.tab.entries[0].key_len] == '\0',
              "keys are NUL-terminated");
        toml_free(r);
    }
    r = PARSE("[\"\"]\nx = 12\n[''.y]\nz = 1\n");
    const toml_value *empty =
        r && r->u.tab.n == 1 && r->u.tab.entries[0].key_len == 0 ? r->u.tab.entries[0].value : NULL;
    CHECK(is_int(toml_table_get(empty, "x"), 12) && is_int(get(empty, "y.z"), 1), "the empty key as a table name");
    toml_free(r);
    r = PARSE("\"a\\u0000b\" = 1");
    CHECK(r && r->u.tab.n == 1 && r->u.tab.entries[0].key_len == 3 && memcmp(r->u.tab.entries[0].key, "a\0b", 3) == 0,
          "a key containing U+0000 keeps its length");
    toml_free(r);

    r = PARSE("b = 1\na = 2\nc = 3\n");
    CHECK(r && r->u.tab.n == 3 && !strcmp(r->u.tab.entries[0].key, "b") && !strcmp(r->u.tab.entries[1].key, "a") &&
              !strcmp(r->u.tab.entries[2].key, "c"),
          "entries keep document order");
    toml_free(r);

    EXPECT_ERR("= 1", "1:1", "the key is missing");
    EXPECT_ERR("a b = 1", "1:3", "bare keys cannot contain spaces");
    EXPECT_ERR("a. = 1", "1:4", "expected a key");
    EXPECT_ERR(".a = 1", "1:1", "cannot start or end with a dot");
    EXPECT_ERR("a..b = 1", "1:3", "expected a key");
    EXPECT_ERR("\"\"\"a\"\"\" = 1", "1:1", "multi-line strings cannot be used as keys");
    EXPECT_ERR("'''a''' = 1", "1:1", "multi-line strings cannot be used as keys");
    EXPECT_ERR("a", "1:2", "expected '=' after key 'a'");
    EXPECT_ERR("a =", "1:4", "expected a value after '='");
    EXPECT_ERR("a = # c", "1:5", "expected a value");
    EXPECT_ERR("\xC3\xA9 = 1", "1:1", "must be quoted");
    EXPECT_ERR("a = 1 b = 2", "1:7", "expected end of line");
    EXPECT_ERR("a = b", "1:5", "strings must be quoted");
    EXPECT_ERR("a = True", "1:5", "lowercase");
}

static void test_tables(void) {
    toml_value *r = PARSE("[a]\n"
                          "x = 1\n"
                          "[a.b.c]\n"
                          "y = 2\n"
                          "[ d . 'e' . \"f\" ]\n"
                          "z = 3\n"
                          "[g.h]\n"
                          "[g]\n"
                          "w = 4\n"
                          "[fruit]\n"
                          "apple.color = 'red'\n"
                          "apple.taste.sweet = true\n"
                          "[fruit.apple.texture]\n"
                          "smooth = true\n");
    if (r) {
        CHECK(is_int(get(r, "a.x"), 1) && is_int(get(r, "a.b.c.y"), 2), "headers and nested headers");
        CHECK(is_int(get(r, "d.e.f.z"), 3), "header with whitespace and quoted parts");
        CHECK(is_int(get(r, "g.w"), 4) && get(r, "g.h") && get(r, "g.h")->type == TOML_TABLE,
              "an implicit table may be defined once later");
        CHECK(get(r, "fruit.apple.taste.sweet") && get(r, "fruit.apple.texture.smooth"),
              "a header may add sub-tables to a table made by dotted keys");
        toml_free(r);
    }
    r = PARSE("[a.b.c]\nz = 1\n[a]\nb.d = 2\n");
    CHECK(r && is_int(get(r, "a.b.d"), 2) && is_int(get(r, "a.b.c.z"), 1), "dotted keys may extend an implicit table");
    toml_free(r);

    /* Redefinition rules, each with the position of the offending definition. */
    EXPECT_ERR("lr = 1\nlr = 2\n", "2:1", "duplicate key 'lr' (first defined at 1:1)");
    EXPECT_ERR("[opt]\nlr = 1\n  lr = 2\n", "3:3", "duplicate key 'lr' (first defined at 2:1)");
    EXPECT_ERR("a.b = 1\na.b = 2\n", "2:3", "duplicate key 'a.b' (first defined at 1:3)");
    EXPECT_ERR("a = 1\na.b = 2\n", "2:1", "key 'a' is already defined as an integer at 1:1");
    EXPECT_ERR("[t]\n[t]\n", "2:1", "table [t] is already defined at 1:1");
    EXPECT_ERR("[t.u]\n[t]\n[t]\n", "3:1", "table [t] is already defined at 2:1");
    EXPECT_ERR("[t]\nx = 1\n[t.x]\n", "3:1", "already defined as an integer at 2:1");
    EXPECT_ERR("a.b = 1\n[a]\n", "2:1", "table [a] is already defined by dotted keys at 1:1");
    EXPECT_ERR("[fruit]\napple.color = 1\n[fruit.apple]\n", "3:1", "already defined by dotted keys at 2:1");
    EXPECT_ERR("[a.b.c]\n[a]\nb.c.d = 1\n", "3:3", "cannot use dotted key 'b.c.d' to add to table 'b.c'");
    EXPECT_ERR("[a.b.c]\n[a]\nb.x = 1\n[a.b]\n", "4:1", "table [a.b] is already defined by dotted keys");
    EXPECT_ERR("[a]\nb = 1\n[a.b.c]\n", "3:4", "cannot define [a.b.c]: 'a.b' is already defined as an integer");
    EXPECT_ERR("[]\n", "1:2", "empty table name");
    EXPECT_ERR("[a\n", "1:3", "expected ']' to close the header [a");
    EXPECT_ERR("[a] x = 1\n", "1:5", "expected end of line after the table header");
    EXPECT_ERR("[a.]\n", "1:4", "expected a key");
    EXPECT_ERR("[a b]\n", "1:4", "expected ']'");
    EXPECT_ERR("[a]]\n", "1:4", "expected end of line");
    EXPECT_ERR("[ [a] ]\n", "1:3", "expected a key but found '['");
}

static void test_inline_tables(void) {
    toml_value *r = PARSE("p = { x = 1, y = 2 }\n"
                          "e = {}\n"
                          "n = { a = { b = { c = 'deep' } }, l = [1, {m = 2}] }\n"
                          "d = { a.b = 1, a.c = 2 }\n");
    if (r) {
        CHECK(is_int(get(r, "p.x"), 1) && is_int(get(r, "p.y"), 2), "inline table");
        CHECK(get(r, "e") && get(r, "e")->type == TOML_TABLE && get(r, "e")->u.tab.n == 0, "empty inline table");
        CHECK(IS_STR(get(r, "n.a.b.c"), "deep"), "nested inline tables");
        CHECK(is_int(toml_table_get(toml_array_get(get(r, "n.l"), 1), "m"), 2), "inline table inside an array");
        CHECK(is_int(get(r, "d.a.b"), 1) && is_int(get(r, "d.a.c"), 2), "dotted keys inside an inline table");
        toml_free(r);
    }
    EXPECT_ERR("a = {b = 1}\n[a]\n", "2:1", "table [a] is already defined as an inline table at 1:1");
    EXPECT_ERR("a = {b = 1}\n[a.c]\n", "2:2", "'a' is already defined as an inline table at 1:1");
    EXPECT_ERR("a = {b = 1}\na.c = 2\n", "2:1", "cannot add keys to inline table 'a' defined at 1:1");
    EXPECT_ERR("a = {b = {c = 1}}\na.b.d = 2\n", "2:1", "cannot add keys to inline table 'a'");
    EXPECT_ERR("a = {b = {c = 1}, b.d = 2}\n", "1:19", "cannot add keys to inline table 'b'");
    EXPECT_ERR("a = {}\n[[a]]\n", "2:1", "already defined as an inline table");
    EXPECT_ERR("a = [{b = 1}]\n[a.c]\n", "2:2", "already defined as an array");
    EXPECT_ERR("a = [{b = 1}]\n[[a]]\n", "2:1", "static array cannot be appended");
    EXPECT_ERR("a = {b = 1, b = 2}\n", "1:13", "duplicate key 'b' (first defined at 1:6)");
    EXPECT_ERR("a = {b = 1,}\n", "1:12", "trailing comma");
    EXPECT_ERR("a = {b = 1\n}\n", "1:11", "single line");
    EXPECT_ERR("a = {\nb = 1}\n", "1:6", "single line");
    EXPECT_ERR("a = {b = 1 c = 2}\n", "1:12", "expected ',' or '}'");
    EXPECT_ERR("a = {,}\n", "1:6", "expected a key");
    EXPECT_ERR("a = {b = 1", "1:11", "unterminated inline table: '{' at 1:5");
    r = PARSE("a = {b = \"\"\"x\ny\"\"\", c = [1,\n2]}\n");
    CHECK(r && IS_STR(get(r, "a.b"), "x\ny") && toml_array_len(get(r, "a.c")) == 2,
          "newlines inside values of an inline table are fine");
    toml_free(r);
}

static void test_arrays(void) {
    toml_value *r = PARSE("a = [ 1, 2, 3 ]\n"
                          "b = [ \"x\", 'y', \"\"\"z\"\"\" ]\n"
                          "c = [ [1, 2], ['a'], [] ]\n"
                          "d = [ 1, 'mixed', 2.5, {x = 1}, [true] ]\n"
                          "e = [\n  1, # one\n  2,\n  # comment line\n  3, # trailing comma\n]\n"
                          "f = []\n"
                          "g = [\r\n1,\r\n2\r\n]\n");
    if (r) {
        CHECK(toml_array_len(get(r, "a")) == 3 && is_int(toml_array_get(get(r, "a"), 2), 3), "integer array");
        CHECK(IS_STR(toml_array_get(get(r, "b"), 2), "z"), "string array of all forms");
        CHECK(toml_array_len(toml_array_get(get(r, "c"), 2)) == 0 &&
                  toml_array_get(toml_array_get(get(r, "c"), 1), 0)->type == TOML_STRING,
              "nested arrays");
        CHECK(toml_array_len(get(r, "d")) == 5 && toml_array_get(get(r, "d"), 3)->type == TOML_TABLE,
              "mixed-type arrays are allowed in TOML 1.0");
        CHECK(toml_array_len(get(r, "e")) == 3, "newlines, comments and a trailing comma in an array");
        CHECK(get(r, "f") && toml_array_len(get(r, "f")) == 0, "empty array");
        CHECK(toml_array_len(get(r, "g")) == 2, "CRLF inside an array");
        toml_free(r);
    }
    EXPECT_ERR("a = [1,,2]", "1:8", "expected a value but found ','");
    EXPECT_ERR("a = [,]", "1:6", "expected a value");
    EXPECT_ERR("a = [1 2]", "1:8", "expected ',' or ']'");
    EXPECT_ERR("a = [1, 2", "1:10", "unterminated array: '[' at 1:5");
    EXPECT_ERR("a = [1, 2\nb = 3", "2:1", "expected ',' or ']' after an array element but found 'b'");
}

static void test_array_of_tables(void) {
    toml_value *r = PARSE("[[products]]\n"
                          "name = 'Hammer'\n"
                          "[[products]]\n"
                          "[[products]]\n"
                          "name = 'Nail'\n"
                          "[[fruits]]\n"
                          "name = 'apple'\n"
                          "[fruits.physical]\n"
                          "color = 'red'\n"
                          "[[fruits.varieties]]\n"
                          "name = 'red delicious'\n"
                          "[[fruits.varieties]]\n"
                          "name = 'granny smith'\n"
                          "[[fruits]]\n"
                          "name = 'banana'\n"
                          "[[fruits.varieties]]\n"
                          "name = 'plantain'\n");
    if (r) {
        const toml_value *p = get(r, "products");
        CHECK(p && p->type == TOML_ARRAY && toml_array_len(p) == 3, "three [[products]]");
        CHECK(toml_array_get(p, 1) && toml_array_get(p, 1)->u.tab.n == 0, "an empty element");
        CHECK(IS_STR(toml_table_get(toml_array_get(p, 2), "name"), "Nail"), "last element");
        const toml_value *f = get(r, "fruits");
        const toml_value *f0 = toml_array_get(f, 0), *f1 = toml_array_get(f, 1);
        CHECK(toml_array_len(f) == 2 && IS_STR(get(f0, "physical.color"), "red"),
              "[fruits.physical] goes into the last [[fruits]]");
        CHECK(toml_array_len(toml_table_get(f0, "varieties")) == 2 &&
                  toml_array_len(toml_table_get(f1, "varieties")) == 1,
              "nested arrays of tables attach to the latest parent element");
        toml_free(r);
    }
    EXPECT_ERR("a = []\n[[a]]\n", "2:1", "static array cannot be appended");
    EXPECT_ERR("[a]\n[[a]]\n", "2:1", "already defined as a table");
    EXPECT_ERR("[[a]]\n[a]\n", "2:1", "conflicts with the array of tables [[a]] defined at 1:1");
    EXPECT_ERR("[[a]]\nb = 1\n[[a.b]]\n", "3:1", "already defined as an integer at 2:1");
    EXPECT_ERR("[[a]]\nx.y = 1\n[a.x]\n", "3:1", "already defined by dotted keys");
    EXPECT_ERR("[[a]\n", "1:5", "expected ']]'");
    EXPECT_ERR("[[a] ]\n", "1:5", "expected ']]'");
    EXPECT_ERR("[[]]\n", "1:3", "empty table name");
    r = PARSE("[[a]]\n[[a]]\nx.y = 1\n[a.x.z]\n");
    CHECK(r && toml_array_len(get(r, "a")) == 2 && get(toml_array_get(get(r, "a"), 1), "x.z"),
          "a header may extend dotted tables of the last element");
    toml_free(r);
}

static void test_datetimes(void) {
    toml_value *r = PARSE("a = 1979-05-27T07:32:00Z\n"
                          "b = 1979-05-27T00:32:00-07:00\n"
                          "c = 1979-05-27T00:32:00.999999+07:30\n"
                          "d = 1979-05-27 07:32:00z\n"
                          "e = 1979-05-27t07:32:00\n"
                          "f = 1979-05-27\n"
                          "g = 07:32:00\n"
                          "h = 00:32:00.5\n"
                          "i = 2024-02-29\n"
                          "j = 2000-02-29T23:59:60Z\n"
                          "k = 1987-07-05T17:45:56.1234567891234Z\n"
                          "l = 1979-05-27 # a date and a comment\n"
                          "m = 1979-05-27T07:32:00-00:00\n");
    if (r) {
        const toml_value *a = get(r, "a"), *b = get(r, "b"), *c = get(r, "c");
        CHECK(is_dt(a, TOML_OFFSET_DATETIME, "1979-05-27T07:32:00Z") && a->u.dt.year == 1979 && a->u.dt.month == 5 &&
                  a->u.dt.day == 27 && a->u.dt.hour == 7 && a->u.dt.minute == 32 && a->u.dt.second == 0 &&
                  a->u.dt.offset_minutes == 0,
              "offset date-time in UTC");
        CHECK(is_dt(b, TOML_OFFSET_DATETIME, "1979-05-27T00:32:00-07:00") && b->u.dt.offset_minutes == -420,
              "negative offset");
        CHECK(is_dt(c, TOML_OFFSET_DATETIME, "1979-05-27T00:32:00.999999+07:30") && c->u.dt.offset_minutes == 450 &&
                  c->u.dt.nanosecond == 999999000,
              "fraction and positive offset with minutes");
        CHECK(is_dt(get(r, "d"), TOML_OFFSET_DATETIME, "1979-05-27T07:32:00Z"), "space separator and lowercase z");
        CHECK(is_dt(get(r, "e"), TOML_LOCAL_DATETIME, "1979-05-27T07:32:00"), "lowercase t, local date-time");
        CHECK(is_dt(get(r, "f"), TOML_LOCAL_DATE, "1979-05-27"), "local date");
        CHECK(is_dt(get(r, "g"), TOML_LOCAL_TIME, "07:32:00"), "local time");
        CHECK(is_dt(get(r, "h"), TOML_LOCAL_TIME, "00:32:00.5") && get(r, "h")->u.dt.nanosecond == 500000000,
              "local time with a fraction, digits kept as written");
        CHECK(is_dt(get(r, "i"), TOML_LOCAL_DATE, "2024-02-29"), "leap day in a leap year");
        CHECK(is_dt(get(r, "j"), TOML_OFFSET_DATETIME, "2000-02-29T23:59:60Z"), "leap second and year 2000");
        CHECK(is_dt(get(r, "k"), TOML_OFFSET_DATETIME, "1987-07-05T17:45:56.123456789Z") &&
                  get(r, "k")->u.dt.nanosecond == 123456789,
              "fractions beyond nanoseconds are truncated");
        CHECK(is_dt(get(r, "l"), TOML_LOCAL_DATE, "1979-05-27"), "a date followed by a space and a comment");
        CHECK(is_dt(get(r, "m"), TOML_OFFSET_DATETIME, "1979-05-27T07:32:00-00:00"), "-00:00 offset kept");
        toml_free(r);
    }
    EXPECT_ERR("a = 2023-02-29", "1:13", "day 29 is out of range for 2023-02");
    EXPECT_ERR("a = 1900-02-29", "1:13", "out of range");
    EXPECT_ERR("a = 2023-04-31", "1:13", "out of range");
    EXPECT_ERR("a = 2023-13-01", "1:10", "month 13");
    EXPECT_ERR("a = 2023-00-01", "1:10", "month 00");
    EXPECT_ERR("a = 2023-01-00", "1:13", "day 00");
    EXPECT_ERR("a = 2023-01-01T24:00:00", "1:16", "hour 24");
    EXPECT_ERR("a = 2023-01-01T23:60:00", "1:19", "minute 60");
    EXPECT_ERR("a = 2023-01-01T23:59:61", "1:22", "second 61");
    EXPECT_ERR("a = 2023-01-01T23:59", "1:21", "seconds are required");
    EXPECT_ERR("a = 23:59", "1:10", "seconds are required");
    EXPECT_ERR("a = 2023-01-01T", "1:16", "hour must have exactly 2 digits");
    EXPECT_ERR("a = 2023-1-01", "1:10", "month must have exactly 2 digits");
    EXPECT_ERR("a = 2023-01-01T10:00:00.", "1:25", "expected digits after the decimal point");
    EXPECT_ERR("a = 2023-01-01T10:00:00+24:00", "1:24", "out of range");
    EXPECT_ERR("a = 2023-01-01T10:00:00+0100", "1:27", "expected ':'");
    EXPECT_ERR("a = 10:00:00Z", "1:13", "expected end of line");
    EXPECT_ERR("a = 1:00:00", "1:5", "two digits");
    EXPECT_ERR("a = 2023-01-0110:00:00", "1:15", "expected end of line");
}

static void test_crlf_bom_control(void) {
    toml_value *r =
        PARSE("a = 1\r\n[t]\r\nb = \"\"\"\r\nx\r\ny\"\"\"\r\nc = '''l1\r\nl2'''\r\nd = \"\"\"p\\\r\n  q\"\"\"\r\n");
    if (r) {
        CHECK(is_int(get(r, "a"), 1), "CRLF line endings");
        CHECK(IS_STR(get(r, "t.b"), "x\ny"), "CRLF in a multi-line basic string becomes LF");
        CHECK(IS_STR(get(r, "t.c"), "l1\nl2"), "CRLF in a multi-line literal string becomes LF");
        CHECK(IS_STR(get(r, "t.d"), "pq"), "line-ending backslash before CRLF");
        toml_free(r);
    }
    r = PARSE("\xEF\xBB\xBF"
              "a = 1\n");
    CHECK(r && is_int(get(r, "a"), 1), "a leading UTF-8 BOM is skipped");
    toml_free(r);
    r = PARSE("a = \"\xEF\xBB\xBF\"\n");
    CHECK(r && IS_STR(get(r, "a"), "\xEF\xBB\xBF"), "U+FEFF inside a string is ordinary text");
    toml_free(r);
    EXPECT_ERR("a = 1\n\xEF\xBB\xBF"
               "b = 2\n",
               "2:1", "expected a key but found U+FEFF");
    EXPECT_ERR("a = 1\rb = 2", "1:6", "carriage return not followed by a line feed");
    EXPECT_ERR("a = \"x\ry\"", "1:7", "bare CR");
    EXPECT_ERR("# comment\r", "1:10", "bare CR");
    EXPECT_ERR("# comment \x01\n", "1:11", "control character U+0001");
    EXPECT_ERR("# comment \x7F\n", "1:11", "control character U+007F");
    EXPECT_ERR("a = \"\x1F\"", "1:6", "control character U+001F");
    EXPECT_ERR("a = '\x08'", "1:6", "control character U+0008");
    EXPECT_ERR("a = \"\"\"\x0B\"\"\"", "1:8", "control character U+000B");
    EXPECT_ERR("a = '''\x0C'''", "1:8", "control character U+000C");
    EXPECT_ERR_N("a = \"x\0\"", "1:7", "NUL byte");
    EXPECT_ERR_N("\0", "1:1", "NUL byte");
    EXPECT_ERR("a = 1\n\xFF\xFE", "2:1", "invalid UTF-8");
    EXPECT_ERR("\xFF\xFE"
               "a\0",
               "1:1", "UTF-16");
    EXPECT_ERR("# \xC0\x80 overlong\n", "1:3", "invalid UTF-8");
    EXPECT_ERR("# \xED\xA0\x80 surrogate\n", "1:3", "invalid UTF-8");
    EXPECT_ERR("# \xF4\x90\x80\x80 too big\n", "1:3", "invalid UTF-8");
    EXPECT_ERR("a = \"\xE2\x82\"", "1:6", "invalid UTF-8");
    EXPECT_ERR("a = 'x' # \xE2\x82", "1:11", "invalid UTF-8");
    r = PARSE("a = 'tab\there' # tab\tin comment\n");
    CHECK(r && IS_STR(get(r, "a"), "tab\there"), "tabs are allowed in literal strings and comments");
    toml_free(r);
}

/* pre + a*n + mid + b*n + post, for nesting tests (caller frees). */
static char *repeat3(const char *pre, const char *a, int n, const char *mid, const char *b, const char *post) {
    const char *parts[5] = {pre, a, mid, b, post};
    int times[5] = {1, n, 1, n, 1};
    size_t len = 1;
    for (int k = 0; k < 5; k++) len += strlen(parts[k]) * (size_t)times[k];
    char *s = malloc(len);
    if (!s) return NULL;
    size_t o = 0;
    for (int k = 0; k < 5; k++) {
        size_t pl = strlen(parts[k]);
        for (int i = 0; i < times[k]; i++) {
            memcpy(s + o, parts[k], pl);
            o += pl;
        }
    }
    s[o] = '\0';
    return s;
}

static void test_nesting(void) {
    /* Depth counts tables and arrays below the root: "a = [[...]]" with 512
     * brackets puts the innermost array at depth 512, the limit. */
    char *doc = repeat3("a = ", "[", TOML_MAX_DEPTH, "", "]", "\n");
    toml_value *r = doc ? PARSE(doc) : NULL;
    CHECK(r != NULL, "arrays nested %d deep are accepted", TOML_MAX_DEPTH);
    toml_free(r);
    free(doc);

    doc = repeat3("a = ", "[", TOML_MAX_DEPTH + 1, "", "]", "\n");
    if (doc) EXPECT_ERR(doc, "1:517", "nesting too deep");
    free(doc);

    doc = repeat3("a = ", "[", 200000, "", "]", "\n");
    if (doc) EXPECT_ERR(doc, "1:517", "nesting too deep");
    free(doc);

    doc = repeat3("x = ", "{a = ", 100000, "1", "}", "\n");
    if (doc) EXPECT_ERR(doc, "1:2565", "nesting too deep");
    free(doc);

    doc = repeat3("x = ", "[{a = ", 300, "1", "}]", "\n");
    if (doc) EXPECT_ERR(doc, "1", "nesting too deep");
    free(doc);

    doc = repeat3("", "a.", 100000, "b = 1", "", "\n");
    if (doc) EXPECT_ERR(doc, "1:1025", "too many dotted parts");
    free(doc);

    doc = repeat3("", "a.", TOML_MAX_DEPTH - 1, "b = 1", "", "\n");
    r = doc ? PARSE(doc) : NULL;
    CHECK(r != NULL, "a dotted key of %d parts is accepted", TOML_MAX_DEPTH);
    toml_free(r);
    free(doc);

    doc = repeat3("[", "a.", 300, "b]\n", "", "");
    char *doc2 = doc ? repeat3(doc, "c.", 300, "d = 1\n", "", "") : NULL;
    if (doc2) EXPECT_ERR(doc2, "2", "nesting too deep");
    free(doc);
    free(doc2);

    doc = repeat3("", "[[a]]\n", 3, "", "", "");
    r = doc ? PARSE(doc) : NULL;
    CHECK(r && toml_array_len(get(r, "a")) == 3, "repeated [[a]] headers");
    toml_free(r);
    free(doc);
}

static void test_big_table(void) {
    enum { N = 20000 };
    char *doc = malloc((size_t)N * 32 + 64);
    if (!doc) return;
    char *o = doc;
    for (int i = 0; i < N; i++) o += sprintf(o, "key_%d = %d\n", i, i);
    clock_t t0 = clock();
    toml_value *r = PARSE(doc);
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK(r && r->u.tab.n == N, "a table of %d keys parses (%.3f s)", N, secs);
    CHECK(secs < 2.0, "parsing %d keys is not quadratic (%.3f s)", N, secs);
    CHECK(r && is_int(toml_table_get(r, "key_19999"), 19999) && is_int(toml_table_get(r, "key_0"), 0),
          "lookups in a big table");
    toml_free(r);
    sprintf(o, "key_123 = 0\n");
    char where[32];
    snprintf(where, sizeof where, "%d:1", N + 1);
    expect_err_n(doc, strlen(doc), where, "duplicate key 'key_123' (first defined at 124:1)", __LINE__);
    free(doc);
}

static void test_api_edges(void) {
    /* Input need not be NUL-terminated: only len bytes are read. */
    const char buf[] = "a = 1\nb = 2\nGARBAGE";
    toml_value *r = toml_parse(buf, 12, last_err, sizeof last_err);
    CHECK(r && r->u.tab.n == 2, "only len bytes are parsed");
    toml_free(r);
    r = toml_parse(buf, 3, last_err, sizeof last_err);
    CHECK(!r && strstr(last_err, "1:4:") == last_err, "a document cut short reports end of file (%s)", last_err);

    char small[8];
    r = toml_parse("a = 1\na = 2", 11, small, sizeof small);
    CHECK(!r && strlen(small) == 7 && strncmp(small, "2:1: du", 7) == 0, "a short error buffer is truncated safely");
    r = toml_parse("a = 1\na = 2", 11, NULL, 0);
    CHECK(r == NULL, "errors with no buffer");
    r = toml_parse(NULL, 0, last_err, sizeof last_err);
    CHECK(r && r->u.tab.n == 0, "NULL text with zero length is an empty document");
    toml_free(r);

    /* Messages render awkward keys readably and never overflow. */
    char *longkey = malloc(5000);
    if (longkey) {
        memset(longkey, 'k', 4000);
        strcpy(longkey + 4000, " = 1\n");
        size_t n = strlen(longkey);
        char *doc = malloc(2 * n + 1);
        if (doc) {
            memcpy(doc, longkey, n);
            memcpy(doc + n, longkey, n + 1);
            expect_err_n(doc, strlen(doc), "2:1", "duplicate key 'kkkk", __LINE__);
            CHECK(strstr(last_err, "...") != NULL, "a long key is shortened in the message");
            free(doc);
        }
        free(longkey);
    }
    EXPECT_ERR("\"a\\nb\" = 1\n\"a\\nb\" = 2\n", "2:1", "duplicate key '\"a\\u000Ab\"'");
}

int main(void) {
    test_positions();
    test_types();
    test_integers();
    test_floats();
    test_format_float();
    test_strings();
    test_keys();
    test_tables();
    test_inline_tables();
    test_arrays();
    test_array_of_tables();
    test_datetimes();
    test_crlf_bom_control();
    test_nesting();
    test_big_table();
    test_api_edges();
    printf("%d checks, %d failed\n", n_checks, n_failed);
    return n_failed ? 1 : 0;
}
