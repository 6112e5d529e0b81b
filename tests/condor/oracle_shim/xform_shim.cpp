// Test-only shim: a C ABI over the job-transform entry points of the HTCondor 25.14.1 wheel's
// libcondor_utils, so tests/condor/xform_oracle.py can drive them through ctypes.
//
// We do not have HTCondor's headers. Instead we declare, ourselves, only the member functions
// we call, with the exact signatures the wheel exports (checked with `nm -D | c++filt`), and we
// never rely on HTCondor's object layout for storage: every object is constructed by its own
// exported constructor inside a buffer far larger than the real object (see kObjectBytes).
// Inline members (XFormHash::macros(), MacroStreamXFormSource::getUniverse()...) do not exist in
// the library, so the two things ApplyRoutingJobEdits reaches through macros() are found at run
// time and verified before use (xo_mset_push_source / xo_mset_take_error below).
//
// Everything returned as char* is malloc'd; the caller frees it with xo_free.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

// ---- our own declarations of the exported symbols -------------------------------------------

template <class K, class C> class flat_set;  // HTCondor's sorted-vector set (only pointers passed)

namespace classad {
struct CaseIgnLTStr;
typedef ::flat_set<std::string, CaseIgnLTStr> References;

class ClassAd;  // its default constructor is inline: ads come from ClassAdParser::ParseClassAd

class ClassAdParser {
 public:
  ClassAdParser();
  ClassAd *ParseClassAd(const char *text, bool full);
};
}  // namespace classad

struct macro_eval_context {  // condor_config.h: a plain struct, layout is part of the API
  const char *localname{nullptr};
  const char *subsys{nullptr};
  const char *cwd{nullptr};
  char without_default{0};
  char use_mask{0};
  char also_in_config{0};
  char is_context_ex{0};
};
struct macro_eval_context_ex : macro_eval_context {
  const char *adname{nullptr};
  const classad::ClassAd *ad{nullptr};
};

struct macro_set;  // only passed by reference
class XFormAdUndo;

class CondorError {
 public:
  const char *message(int level) const;
  void clear();
};

class MacroStreamXFormSource {
 public:
  MacroStreamXFormSource(const char *name);
  int open(const char *statements, int &offset, std::string &errmsg);
  bool matches(classad::ClassAd *candidate);
  int setUniverse(const char *uni);
  const char *getFormattedText(std::string &buf, const char *prefix, bool include_comments);
};

class XFormHash {
 public:
  enum Flavor { Iterating = 0, Basic, ParamTable };
  XFormHash(Flavor flavor);
  void init();
  bool local_param_unquoted_string(const char *name, std::string &value, macro_eval_context &ctx);
  char *local_param(const char *name, const char *alt_name, macro_eval_context &ctx);
  int local_param_int(const char *name, int def_value, macro_eval_context &ctx, bool *exists);
};

int ConvertClassadJobRouterRouteToXForm(std::vector<std::string> &statements, std::string &name,
                                        const std::string &routing_string, int &offset,
                                        const classad::ClassAd &base_route_ad, int options);
bool ValidateXForm(MacroStreamXFormSource &xfm, XFormHash &mset, int *step_count, std::string &errmsg);
int TransformClassAd(classad::ClassAd *input_ad, MacroStreamXFormSource &xfm, XFormHash &mset,
                     std::string &errmsg, unsigned int flags, XFormAdUndo *undo);
void optimize_macros(macro_set &set);
bool initAdFromString(const char *str, classad::ClassAd &ad);
bool sPrintAdWithSecrets(std::string &output, const classad::ClassAd &ad, const classad::References *include,
                         const classad::References *exclude);
bool sPrintAdAsJson(std::string &output, const classad::ClassAd &ad, const classad::References *include,
                    bool oneline);
const char *param_unexpanded(const char *name);
char *param(const char *name);
char *expand_param(const char *str);
void param_and_insert_unique_items(const char *param_name, std::vector<std::string> &items, bool case_sensitive);

// ---- storage --------------------------------------------------------------------------------

// The real objects are a few hundred bytes to a few KiB; a constructor only ever writes inside
// its own object, so an oversized, zeroed, max-aligned buffer is always enough.
static const size_t kObjectBytes = 1 << 16;

static void *object_buffer() {
  void *p = nullptr;
  if (posix_memalign(&p, 64, kObjectBytes) != 0) return nullptr;
  memset(p, 0, kObjectBytes);
  return p;
}

static char *dup_string(const std::string &s) {
  char *out = static_cast<char *>(malloc(s.size() + 1));
  if (out) memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

extern "C" {

void xo_free(void *p) { free(p); }

// ---- config ---------------------------------------------------------------------------------

const char *xo_param_unexpanded(const char *name) { return param_unexpanded(name); }

char *xo_param(const char *name) { return param(name); }

char *xo_expand_param(const char *text) { return expand_param(text); }

// param_and_insert_unique_items as JobRouter::config calls it, joined with '\n'.
char *xo_unique_items(const char *knob) {
  std::vector<std::string> items;
  param_and_insert_unique_items(knob, items, false);
  std::string joined;
  for (const auto &item : items) {
    joined += item;
    joined += '\n';
  }
  return dup_string(joined);
}

// ---- ads ------------------------------------------------------------------------------------

// An empty ad from libclassad's own parser, then HTCondor's long-form reader (condor_q -long).
void *xo_ad_from_long_form(const char *text) {
  void *buf = object_buffer();
  if (!buf) return nullptr;
  auto *parser = new (buf) classad::ClassAdParser();
  classad::ClassAd *ad = parser->ParseClassAd("[]", true);
  if (!ad) return nullptr;
  if (!initAdFromString(text, *ad)) return nullptr;
  return ad;
}

char *xo_ad_print(void *ad) {
  std::string out;
  sPrintAdWithSecrets(out, *static_cast<classad::ClassAd *>(ad), nullptr, nullptr);
  return dup_string(out);
}

// The same ad as HTCondor's JSON (condor_q -json), which keeps newlines and backslashes in
// strings unambiguous; the long form above is for people.
char *xo_ad_print_json(void *ad) {
  std::string out;
  sPrintAdAsJson(out, *static_cast<classad::ClassAd *>(ad), nullptr, false);
  return dup_string(out);
}

// ---- transforms -----------------------------------------------------------------------------

void *xo_xform_new(const char *name) {
  void *buf = object_buffer();
  if (!buf) return nullptr;
  return new (buf) MacroStreamXFormSource(name);
}

// MacroStreamXFormSource::open(text, offset=0, errmsg): returns its rval, errmsg via *err.
int xo_xform_open(void *xfm, const char *text, char **err) {
  std::string errmsg;
  int offset = 0;
  int rval = static_cast<MacroStreamXFormSource *>(xfm)->open(text, offset, errmsg);
  *err = dup_string(errmsg);
  return rval;
}

int xo_xform_matches(void *xfm, void *ad) {
  return static_cast<MacroStreamXFormSource *>(xfm)->matches(static_cast<classad::ClassAd *>(ad)) ? 1 : 0;
}

int xo_xform_set_universe(void *xfm, const char *uni) {
  return static_cast<MacroStreamXFormSource *>(xfm)->setUniverse(uni);
}

char *xo_xform_text(void *xfm) {
  std::string buf;
  static_cast<MacroStreamXFormSource *>(xfm)->getFormattedText(buf, "", false);
  return dup_string(buf);
}

// ConvertClassadJobRouterRouteToXForm (the old JOB_ROUTER_ENTRIES syntax, as the 23.x router and
// `condor_job_router_info -convert` use it): one "[ ... ]" route from *offset, over the defaults
// ad (new ClassAd syntax, "[]" for none). Returns "rval\nname\nstatement\n..."; *offset advances.
char *xo_convert_old_route(const char *routing_string, int *offset, const char *defaults_text, const char *name) {
  void *buf = object_buffer();
  if (!buf) return nullptr;
  auto *parser = new (buf) classad::ClassAdParser();
  classad::ClassAd *base = parser->ParseClassAd(defaults_text && *defaults_text ? defaults_text : "[]", true);
  if (!base) return nullptr;
  std::vector<std::string> statements;
  std::string route_name = name ? name : "";
  std::string text = routing_string;
  int rval = ConvertClassadJobRouterRouteToXForm(statements, route_name, text, *offset, *base, 0);
  std::string out = std::to_string(rval) + "\n" + route_name + "\n";
  for (const auto &line : statements) {
    out += line;
    out += "\n";
  }
  return dup_string(out);
}

// ---- the macro set ----------------------------------------------------------------------------

void *xo_mset_new(int flavor, int call_init) {
  void *buf = object_buffer();
  if (!buf) return nullptr;
  auto *mset = new (buf) XFormHash(static_cast<XFormHash::Flavor>(flavor));
  if (call_init) mset->init();
  return mset;
}

// XFormHash has no virtual functions, so its first member, the MACRO_SET, sits at offset 0. Its
// leading members (condor_config.h struct macro_set, pool_allocator.h struct _allocation_pool), as
// of the pinned wheel, are mirrored here only to find `sources` and `errors`; before trusting them
// we check that `sources` holds exactly what setup_macro_defaults() puts first:
// "<Local>", "<Argument>", "<Live>".
struct macro_set_head {
  int size, allocation_size, options, sorted;
  void *table;
  void *metat;
  struct {
    int nHunk, cMaxHunks;
    void *phunks;
  } apool;
  std::vector<const char *> sources;
  void *defaults;
  CondorError *errors;
};

static macro_set_head *verified_head(void *mset) {
  auto *head = static_cast<macro_set_head *>(mset);
  const std::vector<const char *> &src = head->sources;
  if (src.size() < 3 || src.size() > 64 || !head->defaults) return nullptr;
  if (!src[0] || !src[1] || !src[2]) return nullptr;
  if (strcmp(src[0], "<Local>") || strcmp(src[1], "<Argument>") || strcmp(src[2], "<Live>")) return nullptr;
  return head;
}

// ApplyRoutingJobEdits: mset.macros().sources.push_back(route name). Returns 0 if not located.
int xo_mset_push_source(void *mset, const char *name) {
  macro_set_head *head = verified_head(mset);
  if (!head) return 0;
  head->sources.push_back(strdup(name));
  return 1;
}

// Returns the (first) macro-set error message and clears the stack, like ApplyRoutingJobEdits
// does after the route; "" when there is none; NULL if the layout could not be verified.
char *xo_mset_take_error(void *mset) {
  macro_set_head *head = verified_head(mset);
  if (!head) return nullptr;
  if (!head->errors) return dup_string("");
  const char *msg = head->errors->message(0);
  std::string out = msg ? msg : "";
  head->errors->clear();
  return dup_string(out);
}

void xo_mset_optimize(void *mset) { optimize_macros(*static_cast<macro_set *>(mset)); }

int xo_validate(void *xfm, void *mset, char **err) {
  std::string errmsg;
  bool ok = ValidateXForm(*static_cast<MacroStreamXFormSource *>(xfm), *static_cast<XFormHash *>(mset), nullptr,
                          errmsg);
  *err = dup_string(errmsg);
  return ok ? 1 : 0;
}

int xo_transform(void *ad, void *xfm, void *mset, unsigned int flags, char **err) {
  std::string errmsg;
  int rval = TransformClassAd(static_cast<classad::ClassAd *>(ad), *static_cast<MacroStreamXFormSource *>(xfm),
                              *static_cast<XFormHash *>(mset), errmsg, flags, nullptr);
  *err = dup_string(errmsg);
  return rval;
}

static void route_context(macro_eval_context_ex &ctx) {
  ctx.subsys = "XFORM";
  ctx.use_mask = 0x02;
  ctx.is_context_ex = 1;
  ctx.also_in_config = 1;
}

// XFormHash::local_param_unquoted_string, as ParseNext reads a route's GridResource.
char *xo_local_param_unquoted(void *mset, const char *name, int *exists) {
  macro_eval_context_ex ctx;
  route_context(ctx);
  std::string value;
  *exists = static_cast<XFormHash *>(mset)->local_param_unquoted_string(name, value, ctx) ? 1 : 0;
  return dup_string(value);
}

// XFormHash::local_param_int, as ParseNext reads TargetUniverse.
int xo_local_param_int(void *mset, const char *name, int def_value) {
  macro_eval_context_ex ctx;
  route_context(ctx);
  return static_cast<XFormHash *>(mset)->local_param_int(name, def_value, ctx, nullptr);
}

// XFormHash::local_param(name) with the context a route's ParseNext uses after ValidateXForm:
// MacroStreamXFormSource's ctx.init("XFORM") (use_mask um_COUNT_REFS) plus also_in_config.
// *exists is 0 when the macro is not defined.
char *xo_local_param(void *mset, const char *name, int *exists) {
  macro_eval_context_ex ctx;
  route_context(ctx);
  char *value = static_cast<XFormHash *>(mset)->local_param(name, nullptr, ctx);
  *exists = value != nullptr;
  return value;
}

}  // extern "C"
