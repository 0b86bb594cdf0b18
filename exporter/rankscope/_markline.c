/* rankscope._markline: a mark's flight-record line, encoded in C.
 *
 * line(prefix, mark, extra) -> bytes | None
 *
 * prefix: the line's header up to its times, as the writer caches it (ASCII JSON text);
 * mark: a rankscope.schema.Mark; extra: its extra's JSON text (encoded by the caller).
 * Returns prefix + the times + the mark's members + "}\n", byte for byte what the Python
 * encoder (rankscope.schema.Mark.json_members and the writer's times) makes but for the two
 * times, which are read here. Returns None for any value outside the usual types (an int
 * subclass, a bool in an int field, a mapping that is not a dict, a non-str text): the
 * caller then takes the Python encoder, which knows every case. Raises only what an
 * attribute read raises (as the Python encoder would) and MemoryError.
 *
 * Why C: a mark's own cost beyond its reads is Python, and half of it was formatting the
 * line (docs/architecture.md, "What a mark costs"). tests/record/test_mark_encoder.py holds this
 * file to the Python encoder. Its state: the attribute names, interned at import, the json
 * module's string quoting, and the schema's classes' slots, bound by bind(); all held for
 * the process's life and shared (single-phase init: an isolated subinterpreter's import
 * fails, and the schema then takes the Python encoder).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>
#include <time.h>

#ifndef Py_T_OBJECT_EX /* before Python 3.12 */
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

/* --- the line buffer: a stack block, the heap once a card lists many processes ---------- */

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
    char block[4096];
} Line;

enum { DONE = 0, FAILED = -1, DECLINED = 1 }; /* FAILED: a Python exception is set */

static int
reserve(Line *line, Py_ssize_t more)
{
    if (more <= line->cap - line->len) {
        return DONE;
    }
    Py_ssize_t cap = line->cap;
    while (more > cap - line->len) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return FAILED;
        }
        cap *= 2;
    }
    char *data;
    if (line->data == line->block) {
        data = PyMem_Malloc(cap);
        if (data != NULL) {
            memcpy(data, line->block, line->len);
        }
    }
    else {
        data = PyMem_Realloc(line->data, cap);
    }
    if (data == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    line->data = data;
    line->cap = cap;
    return DONE;
}

static int
put(Line *line, const char *text, Py_ssize_t len)
{
    if (reserve(line, len) != DONE) {
        return FAILED;
    }
    memcpy(line->data + line->len, text, len);
    line->len += len;
    return DONE;
}

#define PUT_LITERAL(line, text) put((line), (text), (Py_ssize_t)sizeof(text) - 1)

/* --- values ---------------------------------------------------------------------------- */

static PyObject *quote_ascii; /* json.encoder.encode_basestring_ascii */

/* A str that is already ASCII JSON text (the prefix, the extra), copied as it is. */
static int
put_json_text(Line *line, PyObject *text)
{
    if (!PyUnicode_CheckExact(text)) {
        return DECLINED;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0) {
        return FAILED;
    }
#endif
    if (!PyUnicode_IS_ASCII(text)) {
        return DECLINED;
    }
    return put(line, (const char *)PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text));
}

/* A number's decimal digits, written by hand: snprintf costs ten times as much. */
static int
put_digits(Line *line, long long number)
{
    char digits[24];
    char *end = digits + sizeof digits, *first = end;
    unsigned long long magnitude = number < 0 ? 0ULL - (unsigned long long)number
                                              : (unsigned long long)number;
    do {
        *--first = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude != 0);
    if (number < 0) {
        *--first = '-';
    }
    return put(line, first, end - first);
}

/* seconds.microseconds of a clock's reading at or after 1970, rounded to the microsecond. */
static int
put_seconds(Line *line, const struct timespec *clock)
{
    long long seconds = (long long)clock->tv_sec;
    long micros = (clock->tv_nsec + 500) / 1000; /* tv_nsec is in [0, 1e9) */
    if (micros >= 1000000) {
        seconds += 1;
        micros -= 1000000;
    }
    char fraction[8] = {'.'};
    for (int i = 6; i >= 1; i--) {
        fraction[i] = (char)('0' + micros % 10);
        micros /= 10;
    }
    if (put_digits(line, seconds) != DONE) {
        return FAILED;
    }
    return put(line, fraction, 7);
}

/* A new reference to ASCII JSON text (or NULL, an exception set), put and released. */
static int
put_owned_text(Line *line, PyObject *text)
{
    if (text == NULL) {
        return FAILED;
    }
    int done = put_json_text(line, text);
    Py_DECREF(text);
    return done;
}

/* null, or an exact int's digits (an int subclass's or a bool's text is not its JSON). */
static int
put_number(Line *line, PyObject *value)
{
    if (value == Py_None) {
        return PUT_LITERAL(line, "null");
    }
    if (!PyLong_CheckExact(value)) {
        return DECLINED;
    }
    int overflow = 0;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow == 0) {
        if (number == -1 && PyErr_Occurred()) {
            return FAILED;
        }
        return put_digits(line, number);
    }
    return put_owned_text(line, PyObject_Str(value)); /* past 64 bits: Python's own digits */
}

/* null, or a str as a JSON string: printable ASCII with no quote or backslash is copied;
 * any other str is quoted by json's own encoder, so escapes are exactly the generic one's. */
static int
put_string(Line *line, PyObject *value)
{
    if (value == Py_None) {
        return PUT_LITERAL(line, "null");
    }
    if (!PyUnicode_CheckExact(value)) {
        return DECLINED;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(value) < 0) {
        return FAILED;
    }
#endif
    if (PyUnicode_IS_ASCII(value)) {
        const unsigned char *chars = PyUnicode_DATA(value);
        Py_ssize_t len = PyUnicode_GET_LENGTH(value), i = 0;
        while (i < len && chars[i] >= 0x20 && chars[i] <= 0x7e && chars[i] != '"' &&
               chars[i] != '\\') {
            i++;
        }
        if (i == len) {
            if (reserve(line, len + 2) != DONE) {
                return FAILED;
            }
            line->data[line->len++] = '"';
            memcpy(line->data + line->len, chars, len);
            line->len += len;
            line->data[line->len++] = '"';
            return DONE;
        }
    }
    return put_owned_text(line, PyObject_CallOneArg(quote_ascii, value));
}

static int
put_bool(Line *line, PyObject *value)
{
    if (value == Py_True) {
        return PUT_LITERAL(line, "true");
    }
    if (value == Py_False) {
        return PUT_LITERAL(line, "false");
    }
    return DECLINED;
}

/* {"<pid>":bytes,...} of an exact dict of exact int pids, or null. */
static int
put_procs(Line *line, PyObject *procs)
{
    if (procs == Py_None) {
        return PUT_LITERAL(line, "null");
    }
    if (!PyDict_CheckExact(procs)) {
        return DECLINED;
    }
    Py_ssize_t pos = 0, listed = 0;
    PyObject *pid, *used;
    int done = PUT_LITERAL(line, "{");
    /* no Python code runs in this loop (exact ints only), so the dict's loans hold */
    while (done == DONE && PyDict_Next(procs, &pos, &pid, &used)) {
        if (!PyLong_CheckExact(pid)) { /* None too: put_number would write null */
            return DECLINED;
        }
        done = listed++ > 0 ? PUT_LITERAL(line, ",\"") : PUT_LITERAL(line, "\"");
        if (done == DONE) {
            done = put_number(line, pid);
        }
        if (done == DONE) {
            done = PUT_LITERAL(line, "\":");
        }
        if (done == DONE) {
            done = put_number(line, used);
        }
    }
    return done == DONE ? PUT_LITERAL(line, "}") : done;
}

/* --- reading attributes ------------------------------------------------------------------
 * A class's attributes by position: their interned names and, for the schema's own class
 * (bound at import, see bind()), its slots' definitions, so that a read is one
 * PyMember_GetOne, not a lookup through the type (which cost a third of this encoder). An
 * object of any other class (a subclass, a duck type) is read with PyObject_GetAttr. The
 * cache assumes what the schema never does: a slot replaced on its class afterwards. */

#define ATTRIBUTES_MAX 8

typedef struct {
    const char *text[ATTRIBUTES_MAX + 1]; /* NULL after the last */
    PyObject *name[ATTRIBUTES_MAX];
    PyTypeObject *type;                   /* the class whose slots are bound (held) */
    PyObject *descriptor[ATTRIBUTES_MAX]; /* held: a slot's definition lives with it */
    PyMemberDef *slot[ATTRIBUTES_MAX];
} Attributes;

static int
intern_names(Attributes *attributes)
{
    for (int i = 0; attributes->text[i] != NULL; i++) {
        attributes->name[i] = PyUnicode_InternFromString(attributes->text[i]);
        if (attributes->name[i] == NULL) {
            return -1;
        }
    }
    return 0;
}

/* Bind ``type``'s slots, or raise TypeError: each attribute must be an object slot declared
 * by ``type`` itself, read by the generic getattr (no __getattribute__ or __getattr__ of
 * its own), which is what reading it through PyMember_GetOne skips. */
static int
bind_slots(Attributes *attributes, PyObject *type_object)
{
    if (!PyType_Check(type_object)) {
        PyErr_Format(PyExc_TypeError, "bind() takes classes, not %R", type_object);
        return -1;
    }
    PyTypeObject *type = (PyTypeObject *)type_object;
    if (type->tp_getattro != PyObject_GenericGetAttr) {
        PyErr_Format(PyExc_TypeError, "%s reads its attributes its own way", type->tp_name);
        return -1;
    }
    PyObject *descriptor[ATTRIBUTES_MAX] = {NULL};
    int count = 0;
    for (; attributes->text[count] != NULL; count++) {
        descriptor[count] = PyObject_GetAttr(type_object, attributes->name[count]);
        if (descriptor[count] == NULL ||
            !Py_IS_TYPE(descriptor[count], &PyMemberDescr_Type) ||
            PyDescr_TYPE(descriptor[count]) != type ||
            ((PyMemberDescrObject *)descriptor[count])->d_member->type != Py_T_OBJECT_EX) {
            if (descriptor[count] == NULL) {
                PyErr_Clear();
            }
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot of its own",
                         type->tp_name, attributes->text[count]);
            for (int i = 0; i <= count; i++) {
                Py_XDECREF(descriptor[i]);
            }
            return -1;
        }
    }
    for (int i = 0; i < count; i++) {
        Py_XSETREF(attributes->descriptor[i], descriptor[i]);
        attributes->slot[i] = ((PyMemberDescrObject *)descriptor[i])->d_member;
    }
    Py_INCREF(type);
    Py_XSETREF(attributes->type, type);
    return 0;
}

/* A new reference to ``owner``'s attribute number ``i``, or NULL with an exception. */
static PyObject *
read_attribute(Attributes *attributes, PyObject *owner, int i)
{
    if (Py_TYPE(owner) == attributes->type) {
        return PyMember_GetOne((const char *)owner, attributes->slot[i]); /* unset: raises */
    }
    return PyObject_GetAttr(owner, attributes->name[i]);
}

/* --- sections: each member's key text (with the brace or comma before it) and its form,
 * in the Python encoder's order; the attributes' names are the sections' own. ------------ */

typedef enum { NUMBER, STRING, BOOL, PROCS } Form;

typedef struct {
    const char *key[ATTRIBUTES_MAX + 1];
    Form form[ATTRIBUTES_MAX];
    Attributes attributes;
} Section;

static Section device_section = {
    .key = {",\"device\":{\"index\":", ",\"uuid\":", ",\"nvml_index\":", ",\"why\":"},
    .form = {NUMBER, STRING, NUMBER, STRING},
    .attributes = {.text = {"index", "uuid", "nvml_index", "why"}},
};
static Section torch_section = {
    .key = {",\"torch\":{\"reserved\":", ",\"allocated\":", ",\"peak_allocated\":",
            ",\"num_alloc_retries\":", ",\"num_ooms\":", ",\"why\":"},
    .form = {NUMBER, NUMBER, NUMBER, NUMBER, NUMBER, STRING},
    .attributes = {.text = {"reserved", "allocated", "peak_allocated", "num_alloc_retries",
                            "num_ooms", "why"}},
};
static Section driver_section = {
    .key = {",\"driver\":{\"free\":", ",\"total\":", ",\"why\":"},
    .form = {NUMBER, NUMBER, STRING},
    .attributes = {.text = {"free", "total", "why"}},
};
static Section nvml_section = {
    .key = {",\"nvml\":{\"self_bytes\":", ",\"procs\":", ",\"why\":"},
    .form = {NUMBER, PROCS, STRING},
    .attributes = {.text = {"self_bytes", "procs", "why"}},
};
static Section arena_section = {
    .key = {":{\"reserved\":", ",\"backed\":", ",\"retained\":", ",\"why\":"},
    .form = {NUMBER, NUMBER, NUMBER, STRING},
    .attributes = {.text = {"reserved", "backed", "retained", "why"}},
};
static Section derived_section = {
    .key = {",\"derived\":{\"non_torch\":", ",\"non_torch_measured\":",
            ",\"unbacked_reservation\":"},
    .form = {NUMBER, BOOL, NUMBER},
    .attributes = {.text = {"non_torch", "non_torch_measured", "unbacked_reservation"}},
};
static Section *const SECTIONS[] = {&device_section, &torch_section, &driver_section,
                                    &nvml_section,   &arena_section, &derived_section};

/* The mark's own attributes, by position. */
enum { PHASE, DEVICE, TORCH, DRIVER, NVML, ARENAS, DERIVED };
static Attributes mark_attributes = {
    .text = {"phase", "device", "torch", "driver", "nvml", "arenas", "derived"},
};

static int
put_member(Line *line, PyObject *value, Form form)
{
    switch (form) {
    case NUMBER:
        return put_number(line, value);
    case STRING:
        return put_string(line, value);
    case BOOL:
        return put_bool(line, value);
    case PROCS:
        return put_procs(line, value);
    }
    return DECLINED;
}

/* The section's members of ``owner``, each key then value, and the closing brace. */
static int
put_section(Line *line, PyObject *owner, Section *section)
{
    for (int i = 0; section->key[i] != NULL; i++) {
        if (put(line, section->key[i], (Py_ssize_t)strlen(section->key[i])) != DONE) {
            return FAILED;
        }
        PyObject *value = read_attribute(&section->attributes, owner, i);
        if (value == NULL) {
            return FAILED;
        }
        int done = put_member(line, value, section->form[i]);
        Py_DECREF(value);
        if (done != DONE) {
            return done;
        }
    }
    return PUT_LITERAL(line, "}");
}

/* The mark's view number ``which`` as a section. */
static int
put_view(Line *line, PyObject *mark, int which, Section *section)
{
    PyObject *view = read_attribute(&mark_attributes, mark, which);
    if (view == NULL) {
        return FAILED;
    }
    int done = put_section(line, view, section);
    Py_DECREF(view);
    return done;
}

/* ,"arenas":{"<name>":{...},...} of an exact dict of exact str names. */
static int
put_arenas(Line *line, PyObject *mark)
{
    PyObject *arenas = read_attribute(&mark_attributes, mark, ARENAS);
    if (arenas == NULL) {
        return FAILED;
    }
    int done = PyDict_CheckExact(arenas) ? PUT_LITERAL(line, ",\"arenas\":{") : DECLINED;
    Py_ssize_t pos = 0, listed = 0;
    PyObject *name, *arena;
    while (done == DONE && PyDict_Next(arenas, &pos, &name, &arena)) {
        if (!PyUnicode_CheckExact(name)) { /* None too: put_string would write null */
            done = DECLINED;
            break;
        }
        /* an attribute read may run Python code: hold what the dict lends */
        Py_INCREF(name);
        Py_INCREF(arena);
        if (listed++ > 0) {
            done = PUT_LITERAL(line, ",");
        }
        if (done == DONE) {
            done = put_string(line, name);
        }
        if (done == DONE) {
            done = put_section(line, arena, &arena_section);
        }
        Py_DECREF(name);
        Py_DECREF(arena);
    }
    if (done == DONE) {
        done = PUT_LITERAL(line, "}");
    }
    Py_DECREF(arenas);
    return done;
}

/* ,"mono":<s>,"wall":<s>: the clocks of time.monotonic() and time.time(), in seconds to
 * the microsecond, as the Python encoder's f"{t:.6f}" writes them (here from the clock's
 * integer reading, with no float between). */
static int
put_times(Line *line)
{
    struct timespec mono, wall;
    if (clock_gettime(CLOCK_MONOTONIC, &mono) != 0 || clock_gettime(CLOCK_REALTIME, &wall) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return FAILED;
    }
    if (mono.tv_sec < 0 || wall.tv_sec < 0) { /* a clock set before 1970: Python's digits */
        return DECLINED;
    }
    if (PUT_LITERAL(line, ",\"mono\":") != DONE || put_seconds(line, &mono) != DONE ||
        PUT_LITERAL(line, ",\"wall\":") != DONE || put_seconds(line, &wall) != DONE) {
        return FAILED;
    }
    return DONE;
}

static int
put_mark(Line *line, PyObject *prefix, PyObject *mark, PyObject *extra)
{
    int done = put_json_text(line, prefix);
    if (done == DONE) {
        done = put_times(line);
    }
    if (done == DONE) {
        done = PUT_LITERAL(line, ",\"phase\":");
    }
    if (done == DONE) {
        PyObject *phase = read_attribute(&mark_attributes, mark, PHASE);
        if (phase == NULL) {
            return FAILED;
        }
        done = put_string(line, phase);
        Py_DECREF(phase);
    }
    if (done == DONE) {
        done = PUT_LITERAL(line, ",\"extra\":");
    }
    if (done == DONE) {
        done = put_json_text(line, extra);
    }
    if (done == DONE) {
        done = put_view(line, mark, DEVICE, &device_section);
    }
    if (done == DONE) {
        done = put_view(line, mark, TORCH, &torch_section);
    }
    if (done == DONE) {
        done = put_view(line, mark, DRIVER, &driver_section);
    }
    if (done == DONE) {
        done = put_view(line, mark, NVML, &nvml_section);
    }
    if (done == DONE) {
        done = put_arenas(line, mark);
    }
    if (done == DONE) {
        done = put_view(line, mark, DERIVED, &derived_section);
    }
    if (done == DONE) {
        done = PUT_LITERAL(line, "}\n");
    }
    return done;
}

static PyObject *
line(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "line() takes 3 arguments (prefix, mark, extra), %zd given",
                     nargs);
        return NULL;
    }
    Line text;
    text.data = text.block;
    text.len = 0;
    text.cap = (Py_ssize_t)sizeof text.block;
    int done = put_mark(&text, args[0], args[1], args[2]);
    PyObject *result = NULL;
    if (done == DONE) {
        result = PyBytes_FromStringAndSize(text.data, text.len);
    }
    else if (done == DECLINED) {
        result = Py_NewRef(Py_None);
    }
    if (text.data != text.block) {
        PyMem_Free(text.data);
    }
    return result;
}

/* bind(mark, device, torch, driver, nvml, arena, derived) -> line: the schema's classes,
 * whose slots line() then reads directly. */
static PyObject *
bind(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Attributes *const bound[] = {
        &mark_attributes,          &device_section.attributes, &torch_section.attributes,
        &driver_section.attributes, &nvml_section.attributes,   &arena_section.attributes,
        &derived_section.attributes,
    };
    const Py_ssize_t count = (Py_ssize_t)(sizeof bound / sizeof bound[0]);
    if (nargs != count) {
        PyErr_Format(PyExc_TypeError,
                     "bind() takes %zd classes (mark, device, torch, driver, nvml, arena, "
                     "derived), %zd given",
                     count, nargs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (bind_slots(bound[i], args[i]) < 0) {
            return NULL;
        }
    }
    return PyObject_GetAttrString(module, "line");
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(mark, device, torch, driver, nvml, arena, derived) -> line: read these classes' "
     "slots directly (rankscope.schema's); returns line()."},
    {"line", (PyCFunction)(void (*)(void))line, METH_FASTCALL,
     "line(prefix, mark, extra) -> bytes | None: the mark's whole line, or None for values "
     "the Python encoder must take."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rankscope._markline",
    .m_doc = "A mark's flight-record line in C (rankscope.schema.Mark.encode_line).",
    .m_size = -1, /* its state is static: names and caches set once, shared */
    .m_methods = methods,
};

static int
intern_all_names(void)
{
    if (intern_names(&mark_attributes) < 0) {
        return -1;
    }
    for (size_t i = 0; i < sizeof SECTIONS / sizeof SECTIONS[0]; i++) {
        Attributes *attributes = &SECTIONS[i]->attributes;
        if (attributes->name[0] == NULL && intern_names(attributes) < 0) {
            return -1;
        }
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__markline(void)
{
    if (mark_attributes.name[0] == NULL && intern_all_names() < 0) {
        return NULL;
    }
    if (quote_ascii == NULL) {
        PyObject *json_encoder = PyImport_ImportModule("json.encoder");
        if (json_encoder == NULL) {
            return NULL;
        }
        quote_ascii = PyObject_GetAttrString(json_encoder, "encode_basestring_ascii");
        Py_DECREF(json_encoder);
        if (quote_ascii == NULL) {
            return NULL;
        }
    }
    return PyModule_Create(&module_def);
}
