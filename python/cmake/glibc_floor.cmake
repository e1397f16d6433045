# glibc_floor.cmake — keeps the wheel's manylinux tag true. python/pyproject.toml tags the x86-64
# wheel manylinux_2_<N> (wheel.tags) and passes the same floor as FLCE_WHEEL_GLIBC_MAX ("2.N"),
# including this file after project(flce) (CMAKE_PROJECT_flce_INCLUDE). Every binary the wheel
# ships (libflce.so.0, flce/bin/flce) is then checked right after it is linked: a versioned glibc
# symbol newer than the floor (a build on a newer glibc can bring one: __isoc23_strtol from 2.38's
# headers, hypot@GLIBC_2.35, ...) fails the build, naming the symbols, instead of giving a wheel
# whose tag promises more machines than it runs on.
# Run as a script (cmake -DFILE=... -DMAX=2.34 -DOBJDUMP=objdump -P glibc_floor.cmake) it checks one file.
if(CMAKE_SCRIPT_MODE_FILE)
  execute_process(COMMAND "${OBJDUMP}" -T "${FILE}" OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "glibc floor: ${OBJDUMP} -T ${FILE} failed (${rc})")
  endif()
  string(REPLACE "\n" ";" lines "${dyn}")
  set(newest 0)
  set(over "")
  foreach(line IN LISTS lines)
    if(line MATCHES "\\(?GLIBC_([0-9]+\\.[0-9]+)(\\.[0-9]+)?\\)?[ \t]+([^ \t]+)$")
      set(v ${CMAKE_MATCH_1})
      if(v VERSION_GREATER newest)
        set(newest ${v})
      endif()
      if(v VERSION_GREATER MAX)
        string(APPEND over "\n  ${CMAKE_MATCH_3}@GLIBC_${v}")
      endif()
    endif()
  endforeach()
  get_filename_component(name "${FILE}" NAME)
  if(over)
    message(FATAL_ERROR "glibc floor: ${name} needs symbols newer than glibc ${MAX}, the floor the "
      "wheel's tag (python/pyproject.toml) promises:${over}\nAvoid them, or raise the tag and "
      "FLCE_WHEEL_GLIBC_MAX together (auditwheel show says which tag the built wheel allows).")
  endif()
  message(STATUS "glibc floor: ${name} needs glibc ${newest} (floor ${MAX})")
  return()
endif()

if(FLCE_WHEEL_GLIBC_MAX)
  if(NOT CMAKE_OBJDUMP)
    message(FATAL_ERROR "glibc floor: no objdump found (binutils) to check the wheel's binaries against "
      "glibc ${FLCE_WHEEL_GLIBC_MAX}")
  endif()
  set(FLCE_GLIBC_FLOOR_SCRIPT "${CMAKE_CURRENT_LIST_FILE}")
  function(flce_wheel_glibc_check)
    foreach(target IN ITEMS flce flce_tool)
      add_custom_command(TARGET ${target} POST_BUILD
        COMMAND "${CMAKE_COMMAND}" "-DFILE=$<TARGET_FILE:${target}>" "-DMAX=${FLCE_WHEEL_GLIBC_MAX}"
                "-DOBJDUMP=${CMAKE_OBJDUMP}" -P "${FLCE_GLIBC_FLOOR_SCRIPT}"
        VERBATIM)
    endforeach()
  endfunction()
  # The targets do not exist yet (this runs inside project()): attach the checks once the top-level
  # CMakeLists.txt has defined them.
  cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL flce_wheel_glibc_check)
endif()
